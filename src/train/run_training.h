// `soltrain sft` / `soltrain pt` as a library call: data → plan → the training loop with gradient
// accumulation, schedule, evaluation, metrics and checkpoints → the final model in output_dir/model.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>

#include "dist/communicator.h"
#include "kernels/ops.h"
#include "train/train_config.h"
#include "train/train_loop.h"

namespace soltrain {

// `ops` is the backend chosen by `device` (the CLI makes it; the train layer knows no device names).
// With `comm` of world size > 1 this process is one rank of a data-parallel job: it trains on its share of
// every global batch (per_device_train_batch_size × gradient_accumulation_steps × world size), and only
// rank 0 logs, evaluates and writes metrics, checkpoints (optimizer shards: every rank) and the model.
// `hooks`: a caller driving the run from code (the Python Trainer) sees the metrics and can stop it.
RunResult run_training(const TrainConfig& c, TrainMode mode, Ops& ops, std::ostream& log, Communicator* comm = nullptr,
                       LoopHooks hooks = {});

}  // namespace soltrain
