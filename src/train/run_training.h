// `soltrain sft` / `soltrain pt` as a library call: data → plan → the training loop with gradient
// accumulation, schedule, evaluation, metrics and checkpoints → the final model in output_dir/model.
#pragma once
#include <cstdint>
#include <iosfwd>

#include "dist/communicator.h"
#include "kernels/ops.h"
#include "train/train_config.h"

namespace soltrain {

struct RunResult {
  int64_t steps = 0, total_steps = 0;
  double first_eval_loss = 0, last_eval_loss = 0;  // NaN without a validation set
  bool interrupted = false;                        // stopped by SIGINT / SIGTERM after a checkpoint
};

// The number of optimizer updates of a run (max_steps, or num_epochs over the packed batches).
int64_t total_training_steps(const TrainConfig& c, int64_t micro_batches_per_epoch);

// `ops` is the backend chosen by `device` (the CLI makes it; the train layer knows no device names).
// With `comm` of world size > 1 this process is one rank of a data-parallel job: it trains on its share of
// every global batch (per_device_train_batch_size × gradient_accumulation_steps × world size), and only
// rank 0 logs, evaluates and writes metrics, checkpoints (optimizer shards: every rank) and the model.
RunResult run_training(const TrainConfig& c, TrainMode mode, Ops& ops, std::ostream& log, Communicator* comm = nullptr);

}  // namespace soltrain
