// Validation: the mean cross-entropy over every counted target of a set of documents, one document per
// row (no packing, so each document is seen exactly once, whatever the batch shape).
#pragma once
#include <cstdint>

#include "data/shards.h"
#include "model/transformer.h"

namespace soltrain {

struct EvalResult {
  double loss = 0;  // NaN when nothing is counted
  int64_t tokens = 0;
};

// `rows` × `seq_len` must be the shape the model was planned for; longer documents are truncated.
EvalResult evaluate(Transformer& model, const ShardSet& docs, int rows, int seq_len);

}  // namespace soltrain
