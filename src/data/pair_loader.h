// Batches of preference pairs: a shards set whose documents 2i and 2i+1 are pair i's chosen and rejected
// answer (each prompt + answer, data/preference.h). Every micro-batch holds both answers of each of its
// pairs, one document per row (so no document attends to another: the two answers share a prompt but not
// attention), pairs shuffled per epoch by seed and resumable from (epoch, index) as the SFT loader is.
#pragma once
#include <cstdint>
#include <vector>

#include "data/loader.h"
#include "data/shards.h"
#include "model/transformer.h"

namespace soltrain {

class PairLoader {
 public:
  // `ref_nll`: the reference's Σ NLL of every document (full fine-tuning; empty with LoRA), attached to
  // the batches. `shuffle` false: pairs in order (evaluation).
  PairLoader(const ShardSet& docs, std::vector<float> ref_nll, int pairs_per_batch, int seq_len, uint64_t seed,
             bool shuffle = true);
  // The next micro-batch of pairs_per_batch pairs (2 × pairs_per_batch rows of seq_len), continuing into
  // the next epoch. With `partial` the epoch's last batch may hold fewer pairs (rows left as padding),
  // and next() returns a batch without pairs once the epoch is done (evaluation).
  HostBatch next(bool partial = false);
  int64_t pairs() const { return int64_t(docs_.documents() / 2); }
  int rows() const { return 2 * per_batch_; }
  const LoaderState& state() const { return state_; }
  void restore(const LoaderState& s);

 private:
  void ensure_order();
  const ShardSet& docs_;
  std::vector<float> ref_;
  int per_batch_, seq_len_;
  uint64_t seed_;
  bool shuffle_;
  LoaderState state_;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
};

}  // namespace soltrain
