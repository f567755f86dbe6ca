// Preference training: the run built from the config as every run is (train/run_builder.h), the reference's
// log-probs, and the DPO driver in the one training loop (train/train_loop.h). Its batches are pairs
// (data/pair_loader.h) and its update runs a reference pass per micro-batch (DpoStep).
#include "train/run_dpo.h"

#include <chrono>
#include <cmath>
#include <ostream>

#include "core/error.h"
#include "data/batch_file.h"
#include "data/pair_loader.h"
#include "model/checkpoint.h"
#include "model/dpo_objective.h"
#include "model/peft_adapter.h"
#include "train/pair_run_driver.h"
#include "train/preference_data.h"
#include "train/run_builder.h"
#include "train/run_training.h"
#include "train/train_loop.h"
#include "train/train_step.h"

namespace soltrain {

namespace fs = std::filesystem;

namespace {

std::vector<std::pair<std::string, double>> trl_values(const DpoMetrics& m, PreferenceLoss loss) {
  if (loss == PreferenceLoss::Kto)  // TRL's KTO metrics (no accuracies: the examples are unpaired)
    return {{"rewards/chosen", m.reward_chosen}, {"rewards/rejected", m.reward_rejected}, {"rewards/margins", m.margin},
            {"logps/chosen", m.logp_chosen},     {"logps/rejected", m.logp_rejected},     {"kl", m.kl}};
  std::vector<std::pair<std::string, double>> v{
      {"rewards/chosen", m.reward_chosen}, {"rewards/rejected", m.reward_rejected},
      {"rewards/accuracies", m.accuracy},  {"rewards/margins", m.margin},
      {"logps/chosen", m.logp_chosen},     {"logps/rejected", m.logp_rejected}};
  if (reference_free(loss)) v.emplace_back("nll_loss", m.nll);  // TRL's ORPO and CPO trainers log it
  return v;
}

// The reference's Σ NLL of every document of `docs`, in document order (full fine-tuning, before training).
std::vector<float> reference_of(Transformer& model, const ShardSet& docs, int pairs_per_batch, int seq_len) {
  std::vector<float> out;
  for (const HostBatch& b : all_pair_batches(docs, {}, pairs_per_batch, seq_len, true)) {
    const std::vector<float> v = reference_nll(model, b);  // chosen, rejected of each pair, in pair order
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// DPO loss and metrics over every validation pair (no gradients).
DpoMetrics evaluate_pairs(Transformer& model, DpoObjective& dpo, const std::vector<HostBatch>& batches) {
  DpoStep(dpo).begin_update(batches);  // the divisors: every pair and chosen token, as an update's
  for (const HostBatch& b : batches) dpo_micro_batch(model, dpo, b, false);
  return dpo.read(model.ops());
}

// DPO in the loop: pairs from the PairLoader, DpoStep's update, TRL's metrics read back from the objective.
class DpoDriver final : public PairRunDriver {
 public:
  DpoDriver(const TrainConfig& c, const DpoConfig& objective, Ops& ops, Transformer& model, PairLoader& loader,
            std::vector<HostBatch> val)
      : PairRunDriver(c, loader, std::move(val)),
        ops_(ops),
        model_(model),
        dcfg_(objective),
        dpo_(ops, dcfg_, int64_t(2 * c.per_device_train_batch_size) * c.sequence_len),
        eval_dpo_(ops, dcfg_, int64_t(2 * c.per_device_train_batch_size) * c.sequence_len) {
    for (const HostBatch& b : val_) val_tokens_ += b.counted();  // the answers' counted targets: eval_tokens
  }
  void update(TrainStep& step, int64_t done, float lr) override {
    DpoStep objective(dpo_);
    step.run(next_update(done), lr, -1, &objective);
  }
  Readout read(const TrainStep&) override {
    const DpoMetrics m = dpo_.read(ops_);  // waits for the update
    NamedValues v = trl_values(m, dcfg_.loss);
    for (auto& load : model_.moe_load()) v.push_back(std::move(load));
    return {m.loss, m.pairs > 0, std::move(v)};
  }
  std::optional<Evaluation> evaluate() override {
    if (val_.empty()) return std::nullopt;
    const DpoMetrics m = evaluate_pairs(model_, eval_dpo_, val_);
    char line[200];
    if (dcfg_.loss == PreferenceLoss::Kto)
      std::snprintf(line, sizeof line, "validation loss %.4f, kl %.4f, margins %.3f over %lld examples", m.loss, m.kl,
                    m.margin, static_cast<long long>(m.pairs));
    else
      std::snprintf(line, sizeof line, "validation loss %.4f, rewards/accuracies %.3f, margins %.3f over %lld pairs",
                    m.loss, m.accuracy, m.margin, static_cast<long long>(m.pairs));
    return Evaluation{m.loss, val_tokens_, trl_values(m, dcfg_.loss), line};
  }

 private:
  Ops& ops_;
  Transformer& model_;
  int64_t val_tokens_ = 0;
  DpoConfig dcfg_;
  DpoObjective dpo_, eval_dpo_;
};

}  // namespace

DpoConfig preference_objective(const DpoSettings& s) {
  DpoConfig d;
  d.loss = s.loss;
  if (s.method) {  // rl: orpo / simpo / kto chooses the trainer; a loss_type given must be its own
    if (s.loss_given && s.loss != *s.method)
      user_error("loss_type ", preference_loss_name(s.loss), " is not one rl: ", preference_loss_name(*s.method),
                 " trains (", *s.method == PreferenceLoss::Kto ? "kto or apo_zero_unpaired" : "leave it out", ")");
    d.loss = *s.method;
  }
  // Axolotl's order: trl.beta / rl_beta, else orpo_alpha, for every preference method
  d.beta = float(!s.beta_given && s.orpo_alpha ? *s.orpo_alpha : s.beta);
  d.label_smoothing = float(s.label_smoothing);
  d.nll_alpha = float(d.loss == PreferenceLoss::Orpo    ? 1.0
                      : d.loss == PreferenceLoss::Simpo ? s.cpo_alpha
                      : d.loss == PreferenceLoss::Kto   ? 0.0
                                                        : s.rpo_alpha);
  d.simpo_gamma = float(s.simpo_gamma);
  // KTO's losses read unpaired examples with their KL documents: only rl: kto prepares them
  if (d.loss == PreferenceLoss::Kto && !(s.method && *s.method == PreferenceLoss::Kto))
    user_error("loss_type ", s.apo_zero_unpaired ? "apo_zero_unpaired" : "kto",
               " is KTO's (TRL's KTOTrainer): set rl: kto");
  d.kto_kl = !s.apo_zero_unpaired;
  d.desirable_weight = float(s.desirable_weight);
  d.undesirable_weight = float(s.undesirable_weight);
  // Another method's settings would be silently unused here (TRL's config classes have no such field): one line.
  const bool kto = d.loss == PreferenceLoss::Kto, simpo = d.loss == PreferenceLoss::Simpo;
  const auto refuse = [&](bool set, const char* keys, const char* whose) {
    if (set) user_error(keys, " ", whose, "; this run trains ", preference_loss_name(d.loss), ": leave it out");
  };
  refuse(!kto && (s.desirable_weight != 1 || s.undesirable_weight != 1), "desirable_weight / undesirable_weight",
         "weigh KTO's examples (rl: kto)");
  refuse(!simpo && (s.simpo_gamma != 0.5 || s.cpo_alpha != 1), "simpo_gamma / cpo_alpha", "are SimPO's (rl: simpo)");
  refuse(s.rpo_alpha != 0 && (kto || simpo || d.loss == PreferenceLoss::Orpo), "rpo_alpha",
         "is DPO's NLL term (SimPO's is cpo_alpha, ORPO's is built in)");
  refuse(s.label_smoothing != 0 && (kto || d.loss == PreferenceLoss::Orpo), "label_smoothing", "is DPO's and SimPO's");
  return d;
}

RunResult run_dpo(const TrainConfig& c, Ops& ops, std::ostream& log, LoopHooks hooks) {
  if (c.gpus > 1)
    user_error("dpo: data parallel (gpus: ", c.gpus, ") is not built yet for preference training; use gpus: 1");
  if (c.dpo.max_prompt_len >= c.sequence_len)
    user_error("max_prompt_len ", c.dpo.max_prompt_len, " leaves no room for an answer in sequence_len ",
               c.sequence_len, ": make it smaller");
  const DpoConfig objective = preference_objective(c.dpo);  // (a loss_type against rl: refused before any work)
  for (const std::string& n : c.notes) log << "dpo: " << n << "\n";
  fs::create_directories(c.output_dir);
  const PreferenceData data = as_data_error([&] { return prepare_preference_data(c, log); });
  const std::optional<LoraConfig> lora = lora_config(c);
  check_update_batches_fit(c, 1, 2 * c.per_device_train_batch_size);
  auto model = load_run_model(c, ops, lora, {&data.train, &data.validation});
  const int B = c.per_device_train_batch_size, T = c.sequence_len;
  configure_model(*model, c, ops, 2 * B);

  // The reference: with LoRA the base itself (adapters off, each micro-batch); otherwise the model as loaded,
  // before any update, once (a resumed run reads what the first run stored).
  std::vector<float> ref_train, ref_val;
  const bool orpo = objective.loss == PreferenceLoss::Orpo, no_reference = reference_free(objective.loss);
  // KTO's micro-batches are its blocks of examples in order, each with its KL documents (TRL's sequential
  // sampling, one row per document: the KL estimate is the block's)
  const bool kto = objective.loss == PreferenceLoss::Kto, pack = c.sample_packing && !kto;
  const bool precomputed = !no_reference && (!lora || c.dpo.precompute_ref);
  if (precomputed) {
    // With LoRA the adapters are turned off for it: a resumed run's adapters are trained, the reference is not.
    model->enable_adapters(false);
    ref_train = cached_reference(
        c, data, [&] { return reference_of(*model, data.train, B, T); }, log);
    ref_val = reference_of(*model, data.validation, B, T);
    model->enable_adapters(true);
  }
  PairLoader loader(data.train, ref_train, B, T, c.seed, !kto, pack, orpo, kto);
  const int64_t micro_per_epoch = loader.batches_in_epoch();
  const ScheduleConfig sched = schedule_config(c, total_training_steps(c, micro_per_epoch));
  TrainStep step(*model, optimizer_config(c));
  DpoDriver driver(c, objective, ops, *model, loader,
                   all_pair_batches(data.validation, ref_val, B, T, pack, orpo, kto));
  TrainLoop loop({c, "dpo", log, ops, nullptr, false, *model, step, sched,
                  run_cadence(c, micro_per_epoch / c.gradient_accumulation_steps), std::move(hooks)},
                 driver);
  loop.resume();
  const char* nll_name = orpo                                      ? "NLL term (chosen prompt and answer) "
                         : objective.loss == PreferenceLoss::Simpo ? "cpo_alpha "
                                                                   : "rpo_alpha ";
  log << "dpo: " << preference_loss_name(objective.loss) << " loss, beta " << objective.beta
      << (objective.loss == PreferenceLoss::Simpo ? cat(", simpo_gamma ", objective.simpo_gamma) : "")
      << (kto ? cat(", desirable_weight ", objective.desirable_weight, ", undesirable_weight ",
                    objective.undesirable_weight,
                    objective.kto_kl ? "; examples in order with their KL documents"
                                     : "; loss_type apo_zero_unpaired (no KL estimate)")
              : "")
      << (objective.label_smoothing > 0 ? cat(", label_smoothing ", objective.label_smoothing) : "")
      << (objective.nll_alpha > 0 ? cat(", ", nll_name, objective.nll_alpha) : "") << "; "
      << (no_reference ? cat(lora ? describe_lora(c) : "full fine-tune", " (no reference model)")
          : lora ? cat(describe_lora(c), precomputed ? " (reference: the base's log-probs, computed before training)"
                                                     : " (reference: the base, adapters off)")
                 : "full fine-tune (reference log-probs computed before training)")
      << "; " << describe_parameters(model->params()) << "; " << loader.pairs()
      << (kto ? " training examples, " : " training pairs, ") << data.validation.documents() / 2 << " validation; "
      << sched.total_steps << " steps of " << (pack ? "at least " : "") << B << (kto ? " examples x " : " pairs x ")
      << c.gradient_accumulation_steps << " accumulation, lr " << c.learning_rate << " "
      << to_string(c.lr_scheduler_type) << "\n";
  return loop.run();
}

}  // namespace soltrain
