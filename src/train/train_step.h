// One optimizer update, the step path every trainer shares (`train`, `sft`, `pt`, `bench`): gradients
// zeroed, each micro-batch's forward and backward under the SFT objective (the update's counted tokens as
// the divisor), the global gradient norm and clipping computed on the device, AdamW. Nothing in it waits
// for the device; the loss and the gradient norm are read back only when asked for (logging steps).
#pragma once
#include <span>

#include "core/buffer.h"
#include "model/objective.h"
#include "model/transformer.h"
#include "train/optimizer.h"

namespace soltrain {

class TrainStep {
 public:
  TrainStep(Transformer& model, const OptimizerConfig& opt);
  // One update at learning rate `lr` over these micro-batches (the model is planned for their shape).
  void run(std::span<const HostBatch> micro_batches, float lr);
  // The last update's loss (mean cross-entropy over its counted targets; NaN when none) and gradient norm
  // before clipping: each reads back from the device (a sync).
  double loss() const;
  double grad_norm() const;
  int64_t counted() const { return counted_; }  // the last update's counted targets
  AdamW& optimizer() { return adamw_; }

 private:
  Transformer& model_;
  OptimizerConfig opt_;
  AdamW adamw_;
  mutable SftObjective sft_;
  Buffer sumsq_;  // F64: Σ g² of the last update
  int64_t counted_ = 0;
};

}  // namespace soltrain
