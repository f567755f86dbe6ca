// The training loop. Gradient accumulation follows HF Trainer with num_items_in_batch: the update's loss is
// the sum of token losses over all micro-batches divided by all their counted tokens, so a micro-batch
// with more trained tokens weighs more (not the mean of per-micro-batch means).
#include "train/run_training.h"

#include <chrono>
#include <cmath>
#include <ostream>

#include "core/error.h"
#include "data/loader.h"
#include "model/checkpoint.h"
#include "model/peft_adapter.h"
#include "train/curves_svg.h"
#include "train/evaluate.h"
#include "train/failed_write.h"
#include "train/loss_watchdog.h"
#include "train/metrics.h"
#include "train/mfu.h"
#include "train/stop_signal.h"
#include "train/train_checkpoint.h"
#include "train/train_data.h"

namespace soltrain {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int64_t total_training_steps(const TrainConfig& c, int64_t micro_batches_per_epoch) {
  if (c.max_steps > 0) return c.max_steps;
  // HF: updates per epoch = micro-batches // accumulation (at least 1), times the epochs, rounded up.
  const int64_t per_epoch = std::max<int64_t>(1, micro_batches_per_epoch / c.gradient_accumulation_steps);
  return std::max<int64_t>(1, int64_t(std::ceil(c.num_epochs * double(per_epoch))));
}

namespace {

// How many rows the loader fills in one pass over epoch 0's order (greedy packing, like Loader::next).
int64_t rows_per_epoch(const Loader& loader, const std::vector<int64_t>& doc_lengths, int seq_len, bool pack) {
  int64_t rows = 0;
  int fill = 0;
  for (int64_t d : loader.epoch_order(0)) {
    const int len = int(std::min<int64_t>(doc_lengths[size_t(d)], seq_len));
    if (fill > 0 && (!pack || fill + len > seq_len)) ++rows, fill = 0;
    fill += len;
  }
  return rows + (fill > 0);
}

int64_t counted_targets(const HostBatch& b) {
  int64_t n = 0;
  for (int32_t t : b.targets) n += t != -100;
  return n;
}

std::string fmt_loss(double v) {
  return std::isfinite(v) ? cat(std::round(v * 1e4) / 1e4) : "n/a";
}

}  // namespace

RunResult run_training(const TrainConfig& c, TrainMode mode, Ops& ops, std::ostream& log) {
  const char* cmd = mode == TrainMode::kSft ? "sft" : "pt";

  fs::create_directories(c.output_dir);
  TrainData data = prepare_train_data(c, log);
  std::optional<LoraConfig> lora;
  if (c.lora.enabled) {
    lora = LoraConfig{c.lora.rank,           float(c.lora.alpha), float(c.lora.dropout),
                      c.lora.target_modules, c.lora.use_rslora,   c.seed};
    lora->validate("config.yaml");
  }
  auto model = load_pretrained(c.model, ops, lora);
  const int rows = c.per_device_train_batch_size, T = c.sequence_len, ga = c.gradient_accumulation_steps;
  for (const ShardSet* set : {&data.train, &data.validation})
    for (int32_t id : set->tokens)
      if (id < 0 || id >= model->config().vocab_size)
        user_error(c.model.string(), ": the tokenizer produced id ", id, " but the model's vocab_size is ",
                   model->config().vocab_size);

  LoaderOptions lo;
  lo.rows = rows;
  lo.seq_len = T;
  lo.seed = c.seed;
  lo.pack = c.sample_packing;
  // Lengths are kept for counting rows: the loader takes the tokens, and copying them could double memory.
  std::vector<int64_t> doc_lengths;
  for (size_t d = 0; d + 1 < data.train.doc_offsets.size(); ++d)
    doc_lengths.push_back(data.train.doc_offsets[d + 1] - data.train.doc_offsets[d]);
  Loader loader(std::move(data.train), lo);
  const int64_t micro_per_epoch = (rows_per_epoch(loader, doc_lengths, T, c.sample_packing) + rows - 1) / rows;
  const int64_t total = total_training_steps(c, micro_per_epoch);
  ScheduleConfig sched{c.lr_scheduler_type, total, c.warmup_steps, c.wsd_decay_ratio};
  if (c.warmup_steps == 0 && c.warmup_ratio > 0) sched.warmup_steps = warmup_from_ratio(total, c.warmup_ratio);

  model->plan(rows, T, parse_recompute(c.recompute, "recompute"));
  AdamW adamw(model->params(), ops);
  const OptimizerConfig opt{float(c.learning_rate), float(c.adamw_beta1),  float(c.adamw_beta2),
                            float(c.adamw_epsilon), float(c.weight_decay), float(c.max_grad_norm)};
  TrainerState state;
  state.total_steps = total;
  state.seed = c.seed;
  if (const auto from = resolve_resume(c)) {
    state = load_checkpoint(*from, *model, adamw);
    if (state.seed != c.seed)
      user_error(from->string(), ": checkpoint was trained with seed ", state.seed, ", config says ", c.seed,
                 " (the data order would differ)");
    loader.restore(state.loader);
    state.total_steps = total;
    log << cmd << ": resuming from " << from->string() << " at step " << state.step << "\n";
  } else if (c.resume_from_checkpoint == "true") {
    log << cmd << ": resume_from_checkpoint: true, but " << c.output_dir.string()
        << " has no checkpoint yet: starting fresh\n";
  } else if (const auto old = list_checkpoints(c.output_dir); !old.empty()) {
    log << cmd << ": note: starting fresh although " << old.back().string()
        << " exists (resume_from_checkpoint: true continues it); checkpoints of this run replace same-numbered ones\n";
  }

  log << cmd << ": " << model->config().architecture << " " << double(model->params().numel()) / 1e6
      << "M parameters on " << c.device << "; " << loader.documents() << " training documents (" << micro_per_epoch
      << " micro-batches of " << rows << " x " << T << " per epoch), " << data.validation.documents() << " validation; "
      << total << " steps, gradient accumulation " << ga << ", lr " << c.learning_rate << " "
      << to_string(c.lr_scheduler_type) << " (warmup " << sched.warmup_steps << ")\n";
  {
    // The memory plan, all allocated already (a run that does not fit has stopped before this line).
    const double gib = double(1u << 30), trainable = double(model->params().numel());
    const double all_weights = trainable + double(model->params().frozen_numel());
    // fp32 masters of the trainable weights, plus the compute copy of every weight (bf16 on GPU; on the CPU
    // the masters are the compute copy, and frozen weights are fp32 values)
    const double weights = ops.activation_dtype() == DType::F32
                               ? 4 * all_weights
                               : 4 * trainable + double(dtype_size(ops.activation_dtype())) * all_weights;
    log << cmd << ": memory plan: weights " << weights / gib << " GiB, gradients " << 4 * trainable / gib
        << " GiB, AdamW moments " << 8 * trainable / gib << " GiB, activations "
        << double(model->activation_bytes()) / gib << " GiB (recompute " << c.recompute << ")\n";
  }

  // MFU on the GPU, against the matmul rate measured here and now (PERFORMANCE.md's convention).
  double flops_per_token = 0, matmul_tflops = 0;
  if (ops.device() != Device::CPU) {
    matmul_tflops = measure_matmul_tflops(ops);
    flops_per_token = model_flops_per_token(model->config(), T, c.lora.enabled);
    log << cmd << ": measured bf16 matmul rate " << matmul_tflops << " TFLOP/s (the MFU roof); "
        << flops_per_token / 1e9 << " GFLOP per token\n";
  }
  MetricsLog metrics(c.output_dir, state.step);
  ProgressLine progress(log);
  const bool has_val = data.validation.documents() > 0;
  RunResult result;
  result.total_steps = total;
  result.first_eval_loss = result.last_eval_loss = NAN;
  auto run_eval = [&](int64_t step) {
    if (!has_val) return;
    const EvalResult e = evaluate(*model, data.validation, rows, T);
    metrics.eval(step, e.loss, e.tokens);
    result.last_eval_loss = e.loss;
    progress.message(cat("step ", step, ": validation loss ", fmt_loss(e.loss), " over ", e.tokens, " tokens"));
  };
  if (state.step == 0) {
    run_eval(0);
    result.first_eval_loss = result.last_eval_loss;
  }
  int64_t last_saved = state.step;
  auto checkpoint = [&]() {
    state.loader = loader.state();
    const fs::path dir = c.output_dir / cat("checkpoint-", state.step);
    save_checkpoint(dir, c, *model, adamw, state);
    prune_checkpoints(c.output_dir, c.save_total_limit);
    last_saved = state.step;
    progress.message(cat("step ", state.step, ": saved ", dir.string()));
  };

  StopSignal stop;
  LossWatchdog watchdog(c.loss_watchdog_threshold, c.loss_watchdog_patience);
  const auto run_start = Clock::now();
  const int64_t first_step = state.step;
  Tensor grads = model->params().all_grads();
  std::vector<HostBatch> micro(static_cast<size_t>(ga));
  while (state.step < total && !StopSignal::requested()) {
    const auto t0 = Clock::now();
    ops.zero(grads);
    int64_t n_items = 0;
    for (HostBatch& b : micro) {
      b = loader.next();
      n_items += counted_targets(b);
    }
    // Accumulate Σ cᵢ·gᵢ / N where gᵢ is micro-batch i's mean gradient (what step() adds): before adding gₖ,
    // the running sum is rescaled from 1/c_{k-1} to 1/c_k units; the last factor turns 1/c_K into 1/N.
    double loss_sum = 0;
    int64_t prev = 0;
    for (const HostBatch& b : micro) {
      const int64_t ck = counted_targets(b);
      if (ck == 0) continue;  // nothing trained in it: contributes nothing
      if (prev > 0) ops.scale(grads, float(double(prev) / double(ck)));
      const StepResult r = model->step(b, /*backward=*/true);
      loss_sum += r.loss * double(ck);
      prev = ck;
    }
    if (prev > 0 && prev != n_items) ops.scale(grads, float(double(prev) / double(n_items)));
    const double loss = n_items ? loss_sum / double(n_items) : NAN;
    const GradNorm gn = grad_norm(ops, model->params(), opt.max_grad_norm);
    const double norm = gn.norm;
    const double lr = c.learning_rate * lr_factor(sched, state.step);
    adamw.step(opt, float(lr), gn.clip_scale);
    ++state.step;
    // NaN/inf loss or gradient norm, loss_watchdog_threshold: stops the run (UserError), checkpoints untouched
    watchdog.after_step(state.step, loss, norm, n_items > 0, c.learning_rate, c.output_dir);

    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
    StepMetrics m;
    m.step = state.step;
    m.total_steps = total;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = norm;
    m.tokens = n_items;
    m.epoch = double(loader.state().epoch) + double(loader.state().index) / double(loader.documents());
    m.tokens_per_s = double(rows) * T * ga / dt;
    m.seconds_left = elapsed / double(state.step - first_step) * double(total - state.step);
    m.gpu_memory_gib = ops.device() == Device::CPU ? 0.0 : ops.memory_used_gib();
    if (matmul_tflops > 0) m.mfu = m.tokens_per_s * flops_per_token / (matmul_tflops * 1e12);
    // A terminal gets the line redrawn every step; logs and files get one entry per logging_steps.
    const bool log_step = state.step % c.logging_steps == 0 || state.step == total;
    if (log_step) write_or_save_and_stop([&] { metrics.train(m); }, checkpoint);  // a full disk stops the run
    if (log_step || progress.tty()) progress.show(m);
    if (c.eval_steps > 0 && state.step % c.eval_steps == 0 && state.step < total) run_eval(state.step);
    if (c.save_steps > 0 && state.step % c.save_steps == 0) checkpoint();
  }
  result.steps = state.step;
  if (StopSignal::requested()) {
    if (state.step > last_saved) checkpoint();
    write_training_curves(metrics.jsonl_path(), c.output_dir / "training_curves.svg");
    progress.message(cat(cmd, ": stopped by signal ", StopSignal::signal_number(), " at step ", state.step,
                         "; resume with resume_from_checkpoint: true"));
    result.interrupted = true;
    return result;
  }
  run_eval(state.step);
  const fs::path saved = c.output_dir / (lora ? "adapter" : "model");
  if (lora)
    save_adapter(*model, saved, c.model.string());  // PEFT's layout: peft, vLLM and soltrain merge read it
  else
    save_pretrained(*model, saved, c.model);
  write_training_curves(metrics.jsonl_path(), c.output_dir / "training_curves.svg");
  std::string summary =
      cat(cmd, ": done, ", state.step, " steps; ", lora ? "adapter" : "model", " saved to ", saved.string());
  if (has_val)
    summary += cat("; validation loss ", fmt_loss(result.first_eval_loss), " -> ", fmt_loss(result.last_eval_loss));
  progress.message(summary);
  return result;
}

}  // namespace soltrain
