// Direct preference optimisation (DPO) and its relatives (IPO, hinge; SimPO and ORPO without a reference) as an
// Objective: forward's Σ NLL per document gives each answer's log-prob, the op (kernels/ops.h preference_loss)
// turns a pair's policy and reference log-probs into the loss and d loss / d NLL per document, and backward gets
// those spread over the document's tokens. The reference sums come from a forward of the frozen base (LoRA:
// adapters off, ReferenceSums below) or, with full fine-tuning, from the batch (HostBatch::ref_nll, computed once
// before training). ORPO's NLL term also counts the chosen prompt's tokens: its batches carry them as targets
// (HostBatch::prompt_targets) and each chosen document is summed as two segments, prompt and answer.
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "model/objective.h"
#include "model/transformer.h"

namespace soltrain {

struct DpoConfig {
  PreferenceLoss loss = PreferenceLoss::Sigmoid;
  // nll_alpha: the chosen answers' mean NLL term's weight (TRL's rpo_alpha for DPO, cpo_alpha for SimPO, 1 for ORPO)
  float beta = 0.1f, label_smoothing = 0, nll_alpha = 0, simpo_gamma = 0.5f;
  float desirable_weight = 1, undesirable_weight = 1;  // KTO's
  bool kto_kl = true;  // KTO's KL estimate; false: TRL's loss_type apo_zero_unpaired (kl 0, no KL documents needed)
};
// sigmoid | ipo | hinge | simpo | orpo | kto
PreferenceLoss parse_preference_loss(const std::string& s, const std::string& where);
const char* preference_loss_name(PreferenceLoss l);

// What an update (or an evaluation) measured, as TRL names it: means over its pairs.
struct DpoMetrics {
  double loss = 0, reward_chosen = 0, reward_rejected = 0, accuracy = 0, margin = 0, logp_chosen = 0, logp_rejected = 0;
  double nll = 0;  // the chosen answers' mean token NLL (TRL's nll_loss)
  double kl = 0;   // KTO: the KL estimate, averaged over the micro-batches (TRL's kl)
  // KTO: chosen = the desirable examples, rejected = the others (each mean over its own kind)
  int64_t pairs = 0;
};

// Host → device copies that never wait for the device: two pinned slots used in turn, each reused only once
// its previous copy is done (an upload from pageable memory would wait for the whole queued forward first).
class StagedUpload {
 public:
  StagedUpload(Ops& ops, size_t bytes) : buf_(ops.alloc_host(2 * bytes)), bytes_(bytes) {}
  void operator()(Ops& ops, Tensor dst, const void* src);

 private:
  Buffer buf_;
  size_t bytes_;
  uint64_t marks_[2] = {0, 0};
  int next_ = 0;
};

class DpoObjective final : public Objective {
 public:
  // Buffers for micro-batches of up to `max_tokens` tokens (documents: at most one per token).
  DpoObjective(Ops& ops, DpoConfig cfg, int64_t max_tokens);
  // An update (or an evaluation) over `pairs` pairs whose chosen answers count `chosen_tokens` targets: the
  // loss is the mean over the pairs (TRL's per-batch mean, over the whole accumulated batch) plus nll_alpha
  // times the chosen answers' mean token NLL.
  void begin_update(int64_t pairs, int64_t chosen_tokens);
  // The reference's Σ NLL per document of the micro-batch forward runs next: from the device (a reference
  // forward's doc_nll) or from the batch's ref_nll.
  void set_reference(Ops& ops, const Tensor& ref_doc_nll);
  void set_reference(Ops& ops, const HostBatch& batch);

  bool weights_before_forward() const override { return false; }
  // ORPO sums its own segments (prompt and answer apart)
  bool needs_document_sums() const override { return cfg_.loss != PreferenceLoss::Orpo; }
  void token_weights(Ops& ops, const ForwardOutputs& out, Tensor weight) override;
  void add_loss(Ops& ops, const ForwardOutputs& out) override;
  // The update's metrics so far, read back (a sync: call on logging steps).
  DpoMetrics read(Ops& ops) const;
  const DpoConfig& config() const { return cfg_; }

 private:
  Ops& ops_;
  DpoConfig cfg_;
  int64_t max_docs_;
  Buffer pairs_, ref_, doc_weight_, stats_, segments_, segment_nll_;
  std::vector<int32_t> host_pairs_, host_segments_;
  std::vector<float> host_ref_;
  StagedUpload upload_pairs_, upload_ref_, upload_segments_;
  int64_t docs_ = 0;  // documents (ORPO: segments) of the current micro-batch
  Tensor cu_;         // their offsets, on the device
  int64_t update_pairs_ = 0, update_chosen_tokens_ = 0;
  bool first_ = true;
};

// The reference pass's objective: keeps forward's Σ NLL per document (no loss, no backward).
class ReferenceSums final : public Objective {
 public:
  explicit ReferenceSums(DpoObjective& dpo) : dpo_(dpo) {}
  bool weights_before_forward() const override { return false; }
  bool needs_document_sums() const override { return true; }
  void token_weights(Ops&, const ForwardOutputs&, Tensor) override {}
  void add_loss(Ops& ops, const ForwardOutputs& out) override { dpo_.set_reference(ops, out.doc_nll); }

 private:
  DpoObjective& dpo_;
};

// Counted targets per document of a batch (its cu_seqlens, or one document per row).
std::vector<int32_t> counted_per_document(const HostBatch& b);
// The batch's document offsets: its cu_seqlens, or one document per row.
std::vector<int32_t> document_offsets(const HostBatch& b);

// The model's Σ NLL of each pair document of `batch` (in batch.pairs' order), read back: full fine-tuning's
// reference, computed once before training and stored with the data.
std::vector<float> reference_nll(Transformer& model, const HostBatch& batch);

// One micro-batch's forward and backward under DPO, the reference first: the batch's precomputed ref_nll when
// it has them (full fine-tuning; LoRA with precompute_ref_log_probs), else (LoRA) a forward with the adapters off;
// none for the losses without a reference (SimPO, ORPO).
void dpo_micro_batch(Transformer& model, DpoObjective& dpo, const HostBatch& batch, bool backward);

}  // namespace soltrain
