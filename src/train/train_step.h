// One optimizer update, the step path every trainer shares (`train`, `sft`, `pt`, `dpo`, `bench`, Python):
// gradients zeroed, each micro-batch's passes under the update's objective (SFT's cross-entropy with the
// update's counted tokens as the divisor unless another is given), the global gradient norm and clipping
// computed on the device, AdamW. Nothing in it waits
// for the device; the loss and the gradient norm are read back only when asked for (logging steps).
#pragma once
#include <functional>
#include <memory>
#include <span>

#include "core/buffer.h"
#include "dist/communicator.h"
#include "model/dpo_objective.h"
#include "model/grpo_objective.h"
#include "model/objective.h"
#include "model/reward_objective.h"
#include "model/transformer.h"
#include "train/backward_update.h"
#include "train/data_parallel.h"
#include "train/grad_offload.h"
#include "train/optimizer.h"

namespace soltrain {

// Why ZeRO `zero_stage` cannot run the optimizer `opt` (nullptr: it can). Stages 1-3 update through AdamW's
// sharded form (fp32 or low-bit moments, resident or offloaded): Muon and offloaded gradients are not built there.
// TrainStep refuses such a pair in one line; callers ask first to name their own settings.
const char* sharded_update_refusal(const OptimizerConfig& opt, int zero_stage);

// How an update's micro-batches are trained when not by SFT's cross-entropy: the objective sets the update's
// divisors from all its micro-batches, then runs each micro-batch's passes (DPO: the reference, forward and
// backward). TrainStep keeps the rest: zeroing, data parallel's hooks, the norm, clipping and AdamW.
class StepObjective {
 public:
  virtual ~StepObjective() = default;
  virtual void begin_update(std::span<const HostBatch> micro_batches) = 0;
  virtual bool trains(const HostBatch& b) const = 0;  // false: the micro-batch adds nothing (no targets)
  virtual void train_micro_batch(Transformer& model, const HostBatch& b) = 0;
  // After every micro-batch's backward, before the weights change: the last moment the update's starting weights
  // can be read (GRPO's overlapped generation finishes there, and the next batch's old log-probs are taken).
  virtual void before_update() {}
};

// DPO's update: the pairs and chosen tokens of all micro-batches are its divisors (model/dpo_objective.h).
class DpoStep final : public StepObjective {
 public:
  explicit DpoStep(DpoObjective& dpo) : dpo_(dpo) {}
  void begin_update(std::span<const HostBatch> micro_batches) override;
  bool trains(const HostBatch& b) const override { return !b.pairs.empty(); }
  void train_micro_batch(Transformer& model, const HostBatch& b) override;

 private:
  DpoObjective& dpo_;
};

// A reward model's update: the pairs of all micro-batches are the divisor; each micro-batch a forward (its scores)
// and backward.
class RewardStep final : public StepObjective {
 public:
  explicit RewardStep(RewardObjective& reward) : reward_(reward) {}
  void begin_update(std::span<const HostBatch> micro_batches) override { reward_begin_update(reward_, micro_batches); }
  bool trains(const HostBatch& b) const override { return !b.pairs.empty(); }
  void train_micro_batch(Transformer& model, const HostBatch& b) override {
    model.forward(b, &reward_, /*backward_follows=*/true);
    model.backward(reward_);
  }

 private:
  RewardObjective& reward_;
};

// GRPO's update: each completion's share of the loss is set from all the update's micro-batches (the loss
// type's normaliser, model/grpo_objective.h), then each micro-batch runs its reference pass (β > 0 with LoRA),
// forward and backward.
class GrpoStep final : public StepObjective {
 public:
  // `before_update`: called where StepObjective::before_update is (none: nothing)
  explicit GrpoStep(GrpoObjective& grpo, std::function<void()> before_update = {})
      : grpo_(grpo), before_update_(std::move(before_update)) {}
  void begin_update(std::span<const HostBatch> micro_batches) override;
  bool trains(const HostBatch& b) const override { return b.counted() > 0; }
  void train_micro_batch(Transformer& model, const HostBatch& b) override;
  void before_update() override {
    if (before_update_) before_update_();
  }

 private:
  GrpoObjective& grpo_;
  std::function<void()> before_update_;
  const HostBatch* first_ = nullptr;
  std::vector<std::vector<float>> scales_;  // per micro-batch, per completion
};

class TrainStep {
 public:
  TrainStep(Transformer& model, const OptimizerConfig& opt);
  // Data parallel over `comm` (world size > 1) with ZeRO `zero_stage` 0-3 (train/data_parallel.h).
  TrainStep(Transformer& model, const OptimizerConfig& opt, Communicator& comm, int zero_stage);
  ~TrainStep();
  // One update at learning rate `lr` over these micro-batches (the model is planned for their shape).
  // In data parallel they are this rank's share, and `counted_all` the targets of every rank's share (the
  // loss's divisor: every rank sees the whole global batch, so it counts without communicating).
  // `objective`: another than SFT's (its loss is then its own to read; loss() is SFT's).
  void run(std::span<const HostBatch> micro_batches, float lr, int64_t counted_all = -1,
           StepObjective* objective = nullptr);
  // The last update's loss (mean cross-entropy over its counted targets; NaN when none) and gradient norm
  // before clipping: each reads back from the device (a sync).
  double loss() const;
  // Data parallel leaves the last update's weight gathers in flight (the next forward waits per layer):
  // call before reading the weights outside a step (checkpoint, evaluation, export). Free otherwise.
  void settle() {
    if (dp_) dp_->settle();
  }
  double grad_norm() const;
  int64_t counted() const { return counted_; }  // the last update's counted targets (every rank's)
  AdamW& optimizer() { return *adamw_; }
  const AdamW& optimizer() const { return *adamw_; }
  DataParallel* data_parallel() { return dp_.get(); }
  const GradOffload* grad_offload() const { return grad_offload_.get(); }           // null unless offload_grads
  const BackwardUpdate* backward_update() const { return backward_update_.get(); }  // null unless optimizer_in_backward

 private:
  Transformer& model_;
  OptimizerConfig opt_;
  std::unique_ptr<DataParallel> dp_;           // null in a single process
  std::unique_ptr<GradOffload> grad_offload_;  // offload_grads (one process): the layers' gradients in host memory
  std::unique_ptr<AdamW> adamw_;
  std::unique_ptr<BackwardUpdate> backward_update_;  // optimizer_in_backward (one process): layers updated in backward
  mutable SftObjective sft_;
  Buffer sumsq_;     // F64: Σ g² of the last update
  Buffer loss_sum_;  // F64: data parallel: Σ token NLL of the update over every rank
  int64_t counted_ = 0;
};

}  // namespace soltrain
