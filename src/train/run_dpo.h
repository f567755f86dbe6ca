// `soltrain dpo` (and `rl: dpo`, `ipo`, `orpo`, `simpo` in a config) as a library call: preference pairs → the
// reference (LoRA: the base with the adapters off; full fine-tuning: log-probs computed once, stored next to the
// shards) → the training loop (accumulation, schedule, evaluation, metrics, checkpoints, resume) → the model or
// adapter.
#pragma once
#include <iosfwd>

#include "kernels/ops.h"
#include "model/dpo_objective.h"
#include "train/run_training.h"
#include "train/train_config.h"
#include "train/train_loop.h"

namespace soltrain {

// The objective the settings ask for (rl's method; beta, else Axolotl's orpo_alpha, as Axolotl reads them); the NLL
// term's weight is rpo_alpha (DPO), cpo_alpha (SimPO) or 1 (ORPO's own).
DpoConfig preference_objective(const DpoSettings& s);

// first_eval_loss / last_eval_loss hold the validation DPO loss; the metrics (rewards/accuracies, ...) go
// to metrics.jsonl as eval_<TRL name>.
RunResult run_dpo(const TrainConfig& c, Ops& ops, std::ostream& log, LoopHooks hooks = {});

// reward_model: true (train/run_reward.cpp): the same pairs train a Bradley–Terry reward model; first / last_eval_loss
// hold its validation loss, TRL's RewardTrainer metrics (accuracy, margin, min/mean/max_reward) go to
// metrics.jsonl.
RunResult run_reward(const TrainConfig& c, Ops& ops, std::ostream& log, LoopHooks hooks = {});

}  // namespace soltrain
