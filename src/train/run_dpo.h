// `soltrain dpo` (and `rl: dpo` in a config) as a library call: preference pairs → the reference (LoRA: the
// base with the adapters off; full fine-tuning: log-probs computed once, stored next to the shards) → the
// training loop (accumulation, schedule, evaluation, metrics, checkpoints, resume) → the model or adapter.
#pragma once
#include <iosfwd>

#include "kernels/ops.h"
#include "train/run_training.h"
#include "train/train_loop.h"
#include "train/train_config.h"

namespace soltrain {

// first_eval_loss / last_eval_loss hold the validation DPO loss; the metrics (rewards/accuracies, ...) go
// to metrics.jsonl as eval_<TRL name>.
RunResult run_dpo(const TrainConfig& c, Ops& ops, std::ostream& log, LoopHooks hooks = {});

}  // namespace soltrain
