// The objective of a training step: what turns forward's per-token results into a loss and into the
// per-token gradient weights backward consumes, all on the device. SFT / pretraining (the mean
// cross-entropy over counted targets) is here; preference objectives (DPO) and RL losses are further
// implementations that read per-document sums.
#pragma once
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "kernels/ops.h"

namespace soltrain {

struct HostBatch;

// What forward produced for one micro-batch, on the device.
struct ForwardOutputs {
  Tensor token_nll;                 // F32 [N]: -log p(target) at every token, 0 where the target is -100
  Tensor doc_nll;                   // F32 [documents]: Σ token_nll per document of seq (only when the objective asks)
  Tensor targets;                   // I32 [N]
  Tensor token_entropy;             // F32 [N]: the softmax's entropy per token, 0 at -100 (when the objective asks)
  SeqLayout seq;                    // the documents (cu_seqlens) and positions
  int64_t counted = 0;              // targets != -100, counted on the host
  const HostBatch* host = nullptr;  // the batch as given
  // A sequence classifier (ModelConfig::num_labels 1: a reward model): F32 [N], the score head's output at every
  // token (token_nll, doc_nll then hold nothing; weights are d loss / d score)
  Tensor scores;
};

class Objective {
 public:
  virtual ~Objective() = default;
  // True when the token weights do not depend on forward's results (SFT): they are then asked for before
  // forward, and the LM head's backward runs inside forward's chunk loop on logits still in hand. Otherwise
  // (DPO: weights from per-document sums) they are asked for after forward and backward recomputes each
  // chunk of logits (one more LM-head GEMM).
  virtual bool weights_before_forward() const = 0;
  virtual bool needs_document_sums() const { return false; }
  // Whether forward also computes each token's entropy (out.token_entropy): GRPO's `entropy` metric.
  virtual bool wants_entropy() const { return false; }
  // Whether it reads a sequence classifier's scores (out.scores) rather than a causal LM's NLLs: the model must
  // be of that kind.
  virtual bool reads_scores() const { return false; }
  // weight (F32 [N], on the device) = d loss / d token_nll[n] for this micro-batch. Before forward only
  // out.targets, out.seq, out.counted and out.host are filled in.
  virtual void token_weights(Ops& ops, const ForwardOutputs& out, Tensor weight) = 0;
  // After forward: add this micro-batch's part of the loss to the objective's device-side accumulator.
  virtual void add_loss(Ops& ops, const ForwardOutputs& out) = 0;
};

// Supervised fine-tuning and pretraining: loss = Σ token_nll / counted, where counted is the number of
// targets of the whole update (all micro-batches; all ranks in data parallel), as HF Trainer weighs
// gradient accumulation with num_items_in_batch. Each token's weight is 1 / counted, known in advance.
class SftObjective final : public Objective {
 public:
  explicit SftObjective(Ops& ops);
  // Starts an update whose micro-batches count `counted_tokens` targets in all (the loss's divisor).
  void begin_update(int64_t counted_tokens);
  bool weights_before_forward() const override { return true; }
  void token_weights(Ops& ops, const ForwardOutputs& out, Tensor weight) override;
  void add_loss(Ops& ops, const ForwardOutputs& out) override;
  // The update's loss so far, read back to the host (a sync: call on logging steps). NaN when nothing
  // is counted.
  double read_loss(Ops& ops) const;
  // Σ token_nll of the update (F64 [1], on the device), for reductions across ranks.
  Tensor loss_sum() const { return {sum_.data(), DType::F64, {1}, sum_.device()}; }

 private:
  Buffer sum_;
  int64_t counted_ = 0;
  bool first_ = true;
};

// Forward alone, keeping every token's NLL (read back to the host; 0 where the target is -100): the log-probs a
// caller reads (Model.logprobs, GRPO's sampling-policy log-probs). Its weights are 0: no backward follows.
class NllReader final : public Objective {
 public:
  explicit NllReader(std::vector<float>& out) : out_(out) {}
  bool weights_before_forward() const override { return true; }
  void token_weights(Ops& ops, const ForwardOutputs&, Tensor weight) override { ops.fill(weight, 0.0f); }
  void add_loss(Ops& ops, const ForwardOutputs& out) override {
    out_.resize(size_t(out.token_nll.numel()));
    ops.copy(Tensor{out_.data(), DType::F32, {int64_t(out_.size())}, Device::CPU}, out.token_nll);
  }

 private:
  std::vector<float>& out_;
};

}  // namespace soltrain
