// The minimal training loop: repeated steps on one batch with AdamW and clipping. The full trainer
// (datasets, schedules, checkpoints) builds on it.
#pragma once
#include <functional>
#include <vector>

#include "model/transformer.h"
#include "train/optimizer.h"

namespace soltrain {

struct StepLog {
  int step;  // 1-based
  double loss, grad_norm;
  double seconds;
};

struct TrainHistory {
  std::vector<double> losses;      // before each update, then once after the last
  std::vector<double> grad_norms;  // before clipping
};

TrainHistory train_on_batch(Transformer& model, const HostBatch& batch, const OptimizerConfig& opt, int steps,
                            const std::function<void(const StepLog&)>& on_step = {});

}  // namespace soltrain
