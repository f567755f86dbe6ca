// Validation: the mean cross-entropy over every counted target of a set of documents, one document per
// row (no packing, so each document is seen exactly once, whatever the batch shape).
#pragma once
#include <cstdint>
#include <optional>

#include "data/shards.h"
#include "model/transformer.h"

namespace soltrain {

struct EvalResult {
  double loss = 0;  // NaN when nothing is counted
  int64_t tokens = 0;
  // A token classifier's (a process reward model's): the share of counted tokens whose likeliest label is the
  // target (the first of equal ones, numpy's argmax), TRL's compute_accuracy.
  std::optional<double> accuracy;
};

// `rows` × `seq_len` must be the shape the model was planned for; longer documents are truncated.
EvalResult evaluate(Transformer& model, const ShardSet& docs, int rows, int seq_len);

}  // namespace soltrain
