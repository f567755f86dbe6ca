// Batches of preference pairs: a shards set whose documents 2i and 2i+1 are pair i's chosen and rejected
// answer (each prompt + answer, data/preference.h). Every micro-batch of 2 × pairs_per_batch rows holds both
// answers of each of its pairs as separate documents (cu_seqlens: no document attends to another; the two
// answers share a prompt but not attention). Unpacked, each document has a row of its own (pairs_per_batch
// pairs); packed (sample_packing), documents fill rows end to end and a micro-batch takes pairs while both
// answers still fit (at least pairs_per_batch), as SFT's packing fills rows. Pairs are shuffled per epoch by
// seed, resumable from (epoch, index) as the SFT loader is.
#pragma once
#include <cstdint>
#include <vector>

#include "data/loader.h"
#include "data/shards.h"
#include "model/transformer.h"

namespace soltrain {

// KTO's shards: an example document's first mask byte holds this when its completion is undesirable (a
// document's first token is never a target, so the byte is free); its pair's second document is its KL document.
inline constexpr uint8_t kUndesirableMark = 2;

class PairLoader {
 public:
  // `ref_nll`: the reference's Σ NLL of every document (full fine-tuning; empty with LoRA), attached to
  // the batches. `shuffle` false: pairs in order (evaluation). `chosen_prompt_targets` (ORPO): the chosen
  // answer's prompt tokens are targets too, counted in HostBatch::prompt_targets. `unpaired` (KTO): each pair's
  // label read into HostBatch::desirable.
  PairLoader(const ShardSet& docs, std::vector<float> ref_nll, int pairs_per_batch, int seq_len, uint64_t seed,
             bool shuffle = true, bool pack = false, bool chosen_prompt_targets = false, bool unpaired = false);
  // The next micro-batch (2 × pairs_per_batch rows of seq_len), continuing into the next epoch. With
  // `partial` the epoch's last batch may hold fewer pairs (rows left as padding), and next() returns a batch
  // without pairs once the epoch is done (evaluation).
  HostBatch next(bool partial = false);
  int64_t pairs() const { return int64_t(docs_.documents() / 2); }
  int rows() const { return 2 * per_batch_; }
  const LoaderState& state() const { return state_; }
  int64_t batches_in_epoch() const;  // micro-batches one epoch takes (packing makes it fewer than pairs / per batch)
  void restore(const LoaderState& s);

 private:
  void ensure_order();
  const ShardSet& docs_;
  std::vector<float> ref_;
  int per_batch_, seq_len_;
  uint64_t seed_;
  bool shuffle_, pack_, chosen_prompt_targets_, unpaired_;
  LoaderState state_;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
};

// Every pair of `docs` in order, as micro-batches (the last one padded with empty rows): evaluation's, and full
// fine-tuning's reference pass. The flags as PairLoader's.
std::vector<HostBatch> all_pair_batches(const ShardSet& docs, std::vector<float> ref_nll, int pairs_per_batch,
                                        int seq_len, bool pack, bool chosen_prompt_targets = false,
                                        bool unpaired = false);

}  // namespace soltrain
