// One training job from its config, in this process (a single process, or one rank of a data-parallel job):
// hub inputs resolved, the config checked against the model, the outputs prepared, the backend and the
// communicator made, then sft / pt / dpo in the one loop. The CLI's `sft`, `pt` and `dpo` and the Python
// Trainer call it, so a job runs the same from either.
#pragma once
#include <iosfwd>

#include "train/run_training.h"
#include "train/train_config.h"

namespace soltrain {

RunResult run_job(TrainConfig cfg, TrainMode mode, std::ostream& log, LoopHooks hooks = {});

}  // namespace soltrain
