// One training job from its config, in this process (a single process, or one rank of a data-parallel job):
// hub inputs resolved, the config checked against the model, the outputs prepared, the backend and the
// communicator made, then sft / pt / dpo / grpo in the one loop. The CLI's `sft`, `pt`, `dpo` and `grpo` and
// the Python Trainer call it, so a job runs the same from either. `rewards`: GRPO's Python reward functions
// called in the caller's process (the Python GRPOTrainer's callables).
#pragma once
#include <iosfwd>
#include <string>

#include "train/grpo_rewards.h"
#include "train/run_training.h"
#include "train/train_config.h"

namespace soltrain {

RunResult run_job(TrainConfig cfg, TrainMode mode, std::ostream& log, LoopHooks hooks = {},
                  InProcessRewards rewards = {});

// The validation loss (mean over counted targets, one document per row) of what the job trained: output_dir's
// model, or with LoRA the base with output_dir's adapter; the config's model when nothing is trained yet.
// SFT and pt (a preference run's validation metrics come from its own evaluations during training).
struct JobEvaluation {
  double loss = 0;
  int64_t tokens = 0;
  std::string model;  // what was evaluated
};
JobEvaluation evaluate_job(TrainConfig cfg, std::ostream& log);

}  // namespace soltrain
