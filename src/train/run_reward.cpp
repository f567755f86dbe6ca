// Reward models (`reward_model: true`; TRL's RewardTrainer): the preference run's pairs (train/preference_data.h,
// data/pair_loader.h), the model read as its family's sequence classifier (load_run_model), the Bradley–Terry
// objective (model/reward_objective.h) in the one training loop, saved as transformers'
// *ForSequenceClassification.
#include <ostream>

#include "core/error.h"
#include "data/batch_file.h"
#include "data/pair_loader.h"
#include "model/reward_objective.h"
#include "train/pair_run_driver.h"
#include "train/preference_data.h"
#include "train/run_builder.h"
#include "train/run_dpo.h"
#include "train/train_loop.h"
#include "train/train_step.h"

namespace soltrain {

namespace {

// TRL's RewardTrainer metric names
NamedValues trl_values(const RewardMetrics& m) {
  return {{"accuracy", m.accuracy},
          {"margin", m.margin},
          {"min_reward", m.min_reward},
          {"mean_reward", m.mean_reward},
          {"max_reward", m.max_reward}};
}

class RewardDriver final : public PairRunDriver {
 public:
  RewardDriver(const TrainConfig& c, Ops& ops, PairLoader& loader, Transformer& model, std::vector<HostBatch> val)
      : PairRunDriver(c, loader, std::move(val)),
        ops_(ops),
        model_(model),
        reward_(ops, objective_config(c), int64_t(2 * c.per_device_train_batch_size) * c.sequence_len,
                model.config().pad_token_id),
        eval_(ops, objective_config(c), int64_t(2 * c.per_device_train_batch_size) * c.sequence_len,
              model.config().pad_token_id) {
    for (const HostBatch& b : val_) val_tokens_ += int64_t(b.rows) * b.seq_len;
  }
  static RewardConfig objective_config(const TrainConfig& c) {
    return RewardConfig{float(c.dpo.center_rewards_coefficient)};
  }
  void update(TrainStep& step, int64_t done, float lr) override {
    RewardStep objective(reward_);
    step.run(next_update(done), lr, -1, &objective);
  }
  Readout read(const TrainStep&) override {
    const RewardMetrics m = reward_.read(ops_);  // waits for the update
    return {m.loss, m.pairs > 0, trl_values(m)};
  }
  std::optional<Evaluation> evaluate() override {
    if (val_.empty()) return std::nullopt;
    reward_begin_update(eval_, val_);  // the divisor: every validation pair
    for (const HostBatch& b : val_) model_.forward(b, &eval_, false);
    const RewardMetrics m = eval_.read(ops_);
    char line[200];
    std::snprintf(line, sizeof line, "validation loss %.4f, accuracy %.3f, margin %.3f over %lld pairs", m.loss,
                  m.accuracy, m.margin, static_cast<long long>(m.pairs));
    return Evaluation{m.loss, val_tokens_, trl_values(m), line};
  }

 private:
  Ops& ops_;
  Transformer& model_;
  int64_t val_tokens_ = 0;
  RewardObjective reward_, eval_;
};

}  // namespace

RunResult run_reward(const TrainConfig& c, Ops& ops, std::ostream& log, LoopHooks hooks) {
  SOLTRAIN_CHECK(c.dpo.reward_model, "run_reward without reward_model");
  // A preference loss's settings mean nothing here (TRL's RewardConfig has none of them): one line, not a no-op.
  std::string given;
  for (const auto& [set, key] : {std::pair{c.dpo.loss_given, "loss_type"},
                                 {c.dpo.beta_given || c.dpo.orpo_alpha.has_value(), "beta"},
                                 {c.dpo.rpo_alpha != 0, "rpo_alpha"},
                                 {c.dpo.label_smoothing != 0, "label_smoothing"},
                                 {c.dpo.precompute_ref, "precompute_ref_log_probs"}})
    if (set) given += cat(given.empty() ? "" : ", ", key);
  if (!given.empty())
    user_error("reward_model: true: ", given,
               " set a preference loss, and a reward model's loss (Bradley-Terry) has no such setting: leave ",
               given.find(',') == std::string::npos ? "it" : "them", " out");
  if (c.gpus > 1) user_error("reward_model: data parallel (gpus: ", c.gpus, ") is not built yet; use gpus: 1");
  const std::optional<LoraConfig> lora = lora_config(c);
  for (const std::string& n : c.notes) log << "reward: " << n << "\n";
  std::filesystem::create_directories(c.output_dir);
  const PreferenceData data = as_data_error([&] { return prepare_preference_data(c, log); });
  check_update_batches_fit(c, 1, 2 * c.per_device_train_batch_size);
  auto model = load_run_model(c, ops, lora, {&data.train, &data.validation});
  const int B = c.per_device_train_batch_size, T = c.sequence_len;
  configure_model(*model, c, ops, 2 * B);
  PairLoader loader(data.train, {}, B, T, c.seed, true, c.sample_packing);
  const int64_t micro_per_epoch = loader.batches_in_epoch();
  const ScheduleConfig sched = schedule_config(c, total_training_steps(c, micro_per_epoch));
  TrainStep step(*model, optimizer_config(c));
  RewardDriver driver(c, ops, loader, *model, all_pair_batches(data.validation, {}, B, T, c.sample_packing));
  TrainLoop loop({c, "reward", log, ops, nullptr, false, *model, step, sched,
                  run_cadence(c, micro_per_epoch / c.gradient_accumulation_steps), std::move(hooks)},
                 driver);
  loop.resume();
  log << "reward: Bradley-Terry reward model, " << model->config().architecture << " (one score per sequence, at its "
      << "last token that is not the pad token " << model->config().pad_token_id << ")"
      << (c.dpo.center_rewards_coefficient > 0 ? cat(", center_rewards_coefficient ", c.dpo.center_rewards_coefficient)
                                               : "")
      << "; " << (lora ? describe_lora(c) + " (the score head trained in full beside it)" : "full fine-tune") << "; "
      << describe_parameters(model->params()) << "; " << loader.pairs() << " training pairs, "
      << data.validation.documents() / 2 << " validation; " << sched.total_steps << " steps of "
      << (c.sample_packing ? "at least " : "") << B << " pairs x " << c.gradient_accumulation_steps
      << " accumulation, lr " << c.learning_rate << " " << to_string(c.lr_scheduler_type) << "\n";
  return loop.run();
}

}  // namespace soltrain
