// The preference training loop. It shares the SFT loop's pieces (TrainStep's clipping and AdamW,
// checkpoints, metrics, schedule, stop signal) but not its data path: batches are pairs (data/pair_loader.h)
// and the objective needs a reference pass, so it is a loop of its own rather than flags in the SFT one.
#include "train/run_dpo.h"

#include <chrono>
#include <cmath>
#include <ostream>

#include "core/error.h"
#include "data/pair_loader.h"
#include "model/checkpoint.h"
#include "model/dpo_objective.h"
#include "model/peft_adapter.h"
#include "train/curves_svg.h"
#include "train/failed_write.h"
#include "train/loss_watchdog.h"
#include "train/metrics.h"
#include "train/preference_data.h"
#include "train/stop_signal.h"
#include "train/train_checkpoint.h"
#include "train/train_step.h"

namespace soltrain {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<std::pair<std::string, double>> trl_values(const DpoMetrics& m) {
  return {{"rewards/chosen", m.reward_chosen}, {"rewards/rejected", m.reward_rejected},
          {"rewards/accuracies", m.accuracy},  {"rewards/margins", m.margin},
          {"logps/chosen", m.logp_chosen},     {"logps/rejected", m.logp_rejected}};
}

// Every pair of `docs` in order, as micro-batches (the last one padded with empty rows).
std::vector<HostBatch> all_batches(const ShardSet& docs, std::vector<float> ref, int pairs_per_batch, int seq_len,
                                   bool pack) {
  std::vector<HostBatch> out;
  if (docs.documents() == 0) return out;
  PairLoader l(docs, std::move(ref), pairs_per_batch, seq_len, 0, false, pack);
  for (HostBatch b = l.next(true); !b.pairs.empty(); b = l.next(true)) out.push_back(std::move(b));
  return out;
}

// The reference's Σ NLL of every document of `docs`, in document order (full fine-tuning, before training).
std::vector<float> reference_of(Transformer& model, const ShardSet& docs, int pairs_per_batch, int seq_len) {
  std::vector<float> out;
  for (const HostBatch& b : all_batches(docs, {}, pairs_per_batch, seq_len, true)) {
    const std::vector<float> v = reference_nll(model, b);  // chosen, rejected of each pair, in pair order
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// DPO loss and metrics over every validation pair (no gradients).
DpoMetrics evaluate_pairs(Transformer& model, DpoObjective& dpo, const std::vector<HostBatch>& batches) {
  int64_t pairs = 0, chosen = 0;
  for (const HostBatch& b : batches) {
    const std::vector<int32_t> n = counted_per_document(b);
    for (size_t i = 0; i < b.pairs.size(); i += 2) chosen += n[size_t(b.pairs[i])];
    pairs += int64_t(b.pairs.size() / 2);
  }
  dpo.begin_update(pairs, chosen);
  for (const HostBatch& b : batches) dpo_micro_batch(model, dpo, b, false);
  return dpo.read(model.ops());
}

}  // namespace

RunResult run_dpo(const TrainConfig& c, Ops& ops, std::ostream& log) {
  if (c.gpus > 1)
    user_error("dpo: data parallel (gpus: ", c.gpus, ") is not built yet for preference training; use gpus: 1");
  if (c.dpo.max_prompt_len >= c.sequence_len)
    user_error("max_prompt_len ", c.dpo.max_prompt_len, " leaves no room for an answer in sequence_len ",
               c.sequence_len, ": make it smaller");
  for (const std::string& n : c.notes) log << "dpo: " << n << "\n";
  fs::create_directories(c.output_dir);
  const PreferenceData data = prepare_preference_data(c, log);
  std::optional<LoraConfig> lora;
  if (c.lora.enabled) {
    lora = LoraConfig{c.lora.rank,           float(c.lora.alpha), float(c.lora.dropout),
                      c.lora.target_modules, c.lora.use_rslora,   c.seed};
    lora->offload_base = c.offload_weights;
    lora->offload_resident_layers = c.offload_weights_resident_layers;
    lora->validate("config.yaml");
  }
  auto model = load_pretrained(c.model, ops, lora);
  for (const ShardSet* set : {&data.train, &data.validation})
    for (int32_t id : set->tokens)
      if (id < 0 || id >= model->config().vocab_size)
        user_error(c.model.string(), ": the tokenizer produced id ", id, " but the model's vocab_size is ",
                   model->config().vocab_size);
  const int B = c.per_device_train_batch_size, T = c.sequence_len;
  model->set_residual_dtype(c.residual_dtype);
  ops.set_attention_backward(c.attention_backward);
  if (c.fp8_hybrid) model->enable_fp8(c.fp8);
  model->set_token_tile(c.token_tile);
  model->set_offload_checkpoints(c.offload_activations);
  model->plan(2 * B, T, c.recompute);
  const DpoConfig dcfg{c.dpo.loss, float(c.dpo.beta), float(c.dpo.label_smoothing), float(c.dpo.rpo_alpha)};
  DpoObjective dpo(ops, dcfg, int64_t(2 * B) * T), eval_dpo(ops, dcfg, int64_t(2 * B) * T);

  // The reference: with LoRA the base itself (adapters off, each micro-batch); otherwise the model as loaded,
  // before any update, once (a resumed run reads what the first run stored).
  std::vector<float> ref_train, ref_val;
  const bool precomputed = !lora || c.dpo.precompute_ref;
  if (precomputed) {
    // With LoRA the adapters are turned off for it: a resumed run's adapters are trained, the reference is not.
    model->enable_adapters(false);
    ref_train = cached_reference(
        c, data, [&] { return reference_of(*model, data.train, B, T); }, log);
    ref_val = reference_of(*model, data.validation, B, T);
    model->enable_adapters(true);
  }
  const std::vector<HostBatch> val_batches = all_batches(data.validation, ref_val, B, T, c.sample_packing);
  int64_t val_tokens = 0;  // the answers' counted targets, what eval_tokens reports
  for (const HostBatch& b : val_batches) val_tokens += b.counted();
  PairLoader loader(data.train, ref_train, B, T, c.seed, true, c.sample_packing);
  const int64_t micro_per_epoch = loader.batches_in_epoch();
  TrainerState state;
  state.total_steps = total_training_steps(c, micro_per_epoch);
  state.seed = c.seed;
  ScheduleConfig sched{c.lr_scheduler_type, state.total_steps, c.warmup_steps, c.wsd_decay_ratio};
  if (c.warmup_steps == 0 && c.warmup_ratio > 0)
    sched.warmup_steps = warmup_from_ratio(state.total_steps, c.warmup_ratio);
  const OptimizerConfig opt{float(c.learning_rate), c.adamw_beta1,          c.adamw_beta2, float(c.adamw_epsilon),
                            float(c.weight_decay),  float(c.max_grad_norm), c.moments,     c.offload};
  TrainStep step(*model, opt);
  const int64_t steps_per_epoch = std::max<int64_t>(1, micro_per_epoch / c.gradient_accumulation_steps);
  auto every = [&](double per_epoch) { return std::max<int64_t>(1, int64_t(double(steps_per_epoch) / per_epoch)); };
  const int64_t save_steps = c.save_steps == 0 && c.saves_per_epoch > 0 ? every(c.saves_per_epoch) : c.save_steps;
  const int64_t eval_steps = c.eval_steps == 0 && c.evals_per_epoch > 0 ? every(c.evals_per_epoch) : c.eval_steps;

  if (const auto from = resolve_resume(c)) {
    const int64_t total = state.total_steps;
    state = load_checkpoint(*from, *model, step.optimizer());
    if (state.seed != c.seed)
      user_error(from->string(), ": checkpoint was trained with seed ", state.seed, ", config says ", c.seed,
                 " (the pair order would differ)");
    loader.restore(state.loader);
    state.total_steps = total;
    log << "dpo: resuming from " << from->string() << " at step " << state.step << "\n";
  }
  log << "dpo: " << preference_loss_name(c.dpo.loss) << " loss, beta " << c.dpo.beta
      << (c.dpo.label_smoothing > 0 ? cat(", label_smoothing ", c.dpo.label_smoothing) : "")
      << (c.dpo.rpo_alpha > 0 ? cat(", rpo_alpha ", c.dpo.rpo_alpha) : "") << "; "
      << (lora ? cat("LoRA r", c.lora.rank,
                     precomputed ? " (reference: the base's log-probs, computed before training)"
                                 : " (reference: the base, adapters off)")
               : "full fine-tune (reference log-probs computed before training)")
      << "; " << loader.pairs() << " training pairs, " << data.validation.documents() / 2 << " validation; "
      << state.total_steps << " steps of " << (c.sample_packing ? "at least " : "") << B << " pairs x "
      << c.gradient_accumulation_steps << " accumulation, lr " << c.learning_rate << " "
      << to_string(c.lr_scheduler_type) << "\n";

  MetricsLog metrics(c.output_dir, state.step);
  ProgressLine progress(log);
  RunResult result;
  result.total_steps = state.total_steps;
  result.first_eval_loss = result.last_eval_loss = NAN;
  auto run_eval = [&](int64_t at) {
    if (val_batches.empty()) return;
    const DpoMetrics m = evaluate_pairs(*model, eval_dpo, val_batches);
    metrics.eval(at, m.loss, val_tokens);
    metrics.eval_values(at, trl_values(m));
    result.last_eval_loss = m.loss;
    char line[200];
    std::snprintf(line, sizeof line,
                  "step %lld: validation loss %.4f, rewards/accuracies %.3f, margins %.3f over %lld pairs",
                  static_cast<long long>(at), m.loss, m.accuracy, m.margin, static_cast<long long>(m.pairs));
    progress.message(line);
  };
  if (state.step == 0) {
    run_eval(0);
    result.first_eval_loss = result.last_eval_loss;
  }
  int64_t last_saved = state.step;
  auto checkpoint = [&]() {
    state.loader = loader.state();
    const fs::path dir = c.output_dir / cat("checkpoint-", state.step);
    save_checkpoint(dir, c, *model, step.optimizer(), state);
    prune_checkpoints(c.output_dir, c.save_total_limit);
    last_saved = state.step;
    progress.message(cat("step ", state.step, ": saved ", dir.string()));
  };
  LossWatchdog watchdog(c.loss_watchdog_threshold, c.loss_watchdog_patience);
  StopSignal stop;
  std::vector<HostBatch> micro(size_t(c.gradient_accumulation_steps));
  const auto start = Clock::now();
  const int64_t first_step = state.step;
  bool stopping = false;
  while (state.step < state.total_steps && !(stopping = StopSignal::requested())) {
    const auto t0 = Clock::now();
    for (HostBatch& b : micro) b = loader.next();
    const double lr = c.learning_rate * lr_factor(sched, state.step);
    step.run(micro, float(lr), dpo);
    ++state.step;
    const bool save_step = save_steps > 0 && state.step % save_steps == 0;
    const bool log_step = state.step % c.logging_steps == 0 || state.step == state.total_steps;
    if (log_step || progress.tty() || save_step) {
      const DpoMetrics m = dpo.read(ops);  // waits for the update
      StepMetrics s;
      s.step = state.step;
      s.total_steps = state.total_steps;
      s.loss = m.loss;
      s.lr = lr;
      s.grad_norm = step.grad_norm();
      s.tokens = step.counted();
      s.epoch = double(loader.state().epoch) + double(loader.state().index) / double(loader.pairs());
      // tokens/s counts the chosen and rejected tokens the step ran (rows × sequence_len), as SFT counts its rows
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      s.tokens_per_s = double(2 * B) * T * c.gradient_accumulation_steps / dt;
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      s.seconds_left = elapsed / double(state.step - first_step) * double(state.total_steps - state.step);
      s.gpu_memory_gib = ops.device() == Device::CPU ? 0.0 : ops.memory_used_gib();
      s.extra = trl_values(m);
      watchdog.after_step(state.step, s.loss, s.grad_norm, m.pairs > 0, c.learning_rate, c.output_dir);
      if (log_step) write_or_save_and_stop([&] { metrics.train(s); }, checkpoint);
      if (log_step || progress.tty()) progress.show(s);
    }
    if (eval_steps > 0 && state.step % eval_steps == 0 && state.step < state.total_steps) run_eval(state.step);
    if (save_step) checkpoint();
  }
  result.steps = state.step;
  if (stopping) {
    if (state.step > last_saved) checkpoint();
    write_training_curves(metrics.jsonl_path(), c.output_dir / "training_curves.svg");
    progress.message(cat("dpo: stopped by signal ", StopSignal::signal_number(), " at step ", state.step,
                         "; resume with resume_from_checkpoint: true"));
    result.interrupted = true;
    return result;
  }
  run_eval(state.step);
  const fs::path saved = c.output_dir / (lora ? "adapter" : "model");
  if (lora)
    save_adapter(*model, saved, c.model.string());
  else
    save_pretrained(*model, saved, c.model);
  write_training_curves(metrics.jsonl_path(), c.output_dir / "training_curves.svg");
  progress.message(
      cat("dpo: done, ", state.step, " steps; ", lora ? "adapter" : "model", " saved to ", saved.string()));
  return result;
}

}  // namespace soltrain
