#include "train/train_loop.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>

#include "core/error.h"
#include "core/format.h"
#include "train/curves_svg.h"
#include "train/failed_write.h"
#include "train/loss_watchdog.h"
#include "train/mfu.h"
#include "train/stop_signal.h"
#include "train/train_checkpoint.h"

namespace soltrain {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Test seam (tests/test_sft.cpp, test_run_isolation.cpp): SOLTRAIN_TEST_NAN_STEP=STEP (every rank) or RANK:STEP
// (that rank's readout only, as a rank whose batch went bad would see it first) poisons the model at update STEP
// as a diverging batch would: every loss read after it is NaN, until a checkpoint is restored.
bool g_test_poisoned = false;
struct NanSeam {
  int rank = -1;  // -1: every rank
  int64_t step = -1;
};
NanSeam read_nan_seam() {
  NanSeam n;
  const char* v = std::getenv("SOLTRAIN_TEST_NAN_STEP");
  if (!v) return n;
  long long s = -1;
  if (std::sscanf(v, "%d:%lld", &n.rank, &s) == 2)
    n.step = s;
  else
    n.rank = -1, n.step = std::atoll(v);
  return n;
}
void test_poison(const NanSeam& n, int rank, int64_t step) {
  if (n.step == step && (n.rank < 0 || n.rank == rank)) g_test_poisoned = true;
}

// The per-step log: progress line, metrics files, the caller's hook; MFU against the matmul rate measured at
// the start.
class StepLogger {
 public:
  StepLogger(const LoopSetup& s, RunDriver& d, const TrainerState& state, MetricsLog* metrics, ProgressLine& progress,
             std::function<void()> save)
      : s_(s),
        d_(d),
        state_(state),
        metrics_(metrics),
        progress_(progress),
        save_(std::move(save)),
        start_(Clock::now()),
        first_step_(state.step),
        watchdog_(s.c.loss_watchdog_threshold, s.c.loss_watchdog_patience) {
    if (s.ops.device() == Device::CPU) return;
    matmul_tflops_ = measure_matmul_tflops(s.ops);
    flops_per_token_ = model_flops_per_token(s.model.config(), s.c.sequence_len, s.c.lora.enabled);
    s.log << s.cmd << ": measured bf16 matmul rate " << matmul_tflops_ << " TFLOP/s (the MFU roof); "
          << flops_per_token_ / 1e9 << " GFLOP per token\n";
  }

  // After update `state.step` (1-based), queued from `t0` on. Reads the loss back (waiting for the update to
  // finish) only when it logs, or when `must_check` (a checkpoint follows: it must not hold a diverged
  // model), and times the step then. The watchdog sees every value read: a NaN or infinite loss or gradient
  // norm, or loss_watchdog_threshold exceeded, stops the run (as Axolotl's watchdog, on logged steps).
  void after_update(double lr, Clock::time_point t0, bool must_check) {
    const TrainConfig& c = s_.c;
    const int64_t step = state_.step, total = state_.total_steps;
    // A terminal gets the line redrawn every step; logs and files get one entry per logging_steps.
    const bool log_step = step % c.logging_steps == 0 || step == total;
    // The steps every rank checks alike (a terminal's redraws on rank 0 are extra readouts, not checks).
    const bool check = log_step || must_check;
    if (!check && !progress_.tty()) return;
    StepMetrics m;
    m.step = step;
    m.total_steps = total;
    RunDriver::Readout r = d_.read(s_.step);
    if (g_test_poisoned) r.loss = NAN;
    m.loss = r.loss;
    m.extra = std::move(r.extra);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    m.lr = lr;
    m.grad_norm = s_.step.grad_norm();
    if (s_.dp && check) {
      // The ranks must agree to stop or to recover together (skip_bad_batches), so they check the same steps,
      // and a value gone bad on any rank is bad on all (the loss and norm are reduced, the check is too).
      const bool bad_here = !std::isfinite(m.loss) || !std::isfinite(m.grad_norm);
      if (s_.comm->all_max_host(bad_here ? 1 : 0) > 0 && !bad_here) m.loss = NAN;  // another rank saw it
    }
    if (check || !s_.dp) watchdog_.after_step(step, m.loss, m.grad_norm, r.counted, c.learning_rate, c.output_dir);
    m.tokens = s_.step.counted();
    m.epoch = d_.epoch();
    m.tokens_per_s = d_.tokens_per_update() / dt;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    m.seconds_left = elapsed / double(step - first_step_) * double(total - step);
    m.gpu_memory_gib = s_.ops.device() == Device::CPU ? 0.0 : s_.ops.memory_used_gib();
    if (matmul_tflops_ > 0) m.mfu = m.tokens_per_s * flops_per_token_ / (matmul_tflops_ * 1e12);
    if (log_step && metrics_) write_or_save_and_stop([&] { metrics_->train(m); }, save_);  // a full disk stops the run
    if (log_step || progress_.tty()) progress_.show(m);
    if (log_step && metrics_ && s_.hooks.on_log) s_.hooks.on_log(m);
  }

 private:
  const LoopSetup& s_;
  RunDriver& d_;
  const TrainerState& state_;
  MetricsLog* metrics_;  // rank 0 only
  ProgressLine& progress_;
  std::function<void()> save_;
  Clock::time_point start_;
  int64_t first_step_;
  LossWatchdog watchdog_;
  double flops_per_token_ = 0, matmul_tflops_ = 0;
};

// Fault tests (tests/test_data_parallel.cpp, test_run_isolation.cpp): SOLTRAIN_TEST_RANK_FAULT=R:STEP:kill|raise|stop
// makes rank R die by SIGKILL, throw, or stop (SIGSTOP: alive but silent) after update STEP.
void test_fault(const char* v, int rank, int64_t step) {
  if (!v) return;
  int r = -1;
  long long s = -1;
  char how[8] = {};
  if (std::sscanf(v, "%d:%lld:%7s", &r, &s, how) != 3 || r != rank || s != step) return;
  // SOLTRAIN_TEST_FAULT_ONCE=FILE: the fault fires once (FILE marks it fired), so a restarted job gets past it.
  if (const char* once = std::getenv("SOLTRAIN_TEST_FAULT_ONCE")) {
    if (std::filesystem::exists(once)) return;
    std::ofstream(once) << "fired\n";
  }
  if (std::string(how) == "kill") std::raise(SIGKILL);
  if (std::string(how) == "stop") std::raise(SIGSTOP);
  throw std::runtime_error(cat("injected fault after step ", step));
}

}  // namespace

TrainLoop::TrainLoop(LoopSetup s, RunDriver& driver)
    : s_(std::move(s)), driver_(driver), early_(s_.c.early_stopping_patience, s_.c.early_stopping_threshold) {
  state_.total_steps = s_.sched.total_steps;
  state_.seed = s_.c.seed;
  // The best checkpoint exists only where one is written at every evaluation (Axolotl turns it on for early
  // stopping only then; asked for otherwise, it is refused as transformers refuses it).
  const int64_t save = s_.cadence.save_steps, eval = s_.cadence.eval_steps;
  const bool covered = save > 0 && eval > 0 && save % eval == 0;
  best_at_end_ = s_.c.load_best_model_at_end.value_or(s_.c.early_stopping_patience > 0 && covered);
  if (best_at_end_ && !covered)
    user_error("load_best_model_at_end needs a checkpoint at every evaluation: save steps (", save,
               ") a multiple of eval steps (", eval, ")");
  if (s_.c.early_stopping_patience > 0 && !best_at_end_ && lead())
    s_.log << s_.cmd << ": note: early stopping keeps the last step's model"
           << (covered ? " (load_best_model_at_end: false)"
                       : " (the best is restored only with a checkpoint at every evaluation: save_steps a multiple "
                         "of eval_steps)")
           << "\n";
}

void TrainLoop::restore_from(const fs::path& from) {
  const int64_t total = state_.total_steps;
  if (zero3()) zero3()->before_loading();  // each rank reads its own slices
  state_ = load_checkpoint(from, s_.model, s_.step.optimizer());
  if (zero3() && lead())
    s_.log << s_.cmd << ": ZeRO-3: this rank read " << format_bytes(double(state_.weight_bytes_read)) << " ("
           << state_.weight_bytes_read << " bytes) of the checkpoint's weights: its slices\n";
  if (state_.seed != s_.c.seed)
    user_error(from.string(), ": checkpoint was trained with seed ", state_.seed, ", config says ", s_.c.seed, " (the ",
               driver_.order_name(), " would differ)");
  driver_.restore(state_.loader);
  state_.total_steps = total;
  g_test_poisoned = false;
}

void TrainLoop::resume() {
  const TrainConfig& c = s_.c;
  if (const auto from = resolve_resume(c)) {
    restore_from(*from);
    s_.log << s_.cmd << ": resuming from " << from->string() << " at step " << state_.step << "\n";
  } else if (c.resume_from_checkpoint.kind == ResumeFrom::kLatest) {
    s_.log << s_.cmd << ": resume_from_checkpoint: true, but " << c.output_dir.string()
           << " has no checkpoint yet: starting fresh\n";
  } else if (const auto old = list_checkpoints(c.output_dir); !old.empty()) {
    s_.log
        << s_.cmd << ": note: starting fresh although " << old.back().string()
        << " exists (resume_from_checkpoint: true continues it); checkpoints of this run replace same-numbered ones\n";
  }
  last_saved_ = state_.step;
}

bool TrainLoop::evaluate_at(int64_t step, MetricsLog* metrics, ProgressLine& progress, RunResult& result) {
  s_.step.settle();
  last_eval_step_ = step;
  const std::optional<RunDriver::Evaluation> e = driver_.evaluate();
  // Data parallel: rank 0 (which evaluates) decides, every rank stops and keeps the best's step alike.
  bool stop = e && step > 0 && early_.after_eval(step, e->loss, state_.best_eval);
  if (s_.dp) {
    stop = s_.comm->all_max_host(stop ? 1 : 0) > 0;
    state_.best_eval.step = s_.comm->all_max_host(lead() ? state_.best_eval.step : 0);
  }
  if (e && metrics) {
    metrics->eval(step, e->loss, e->tokens);
    if (!e->extra.empty()) metrics->eval_values(step, e->extra);
    result.last_eval_loss = e->loss;
    progress.message(cat("step ", step, ": ", e->line));
    if (s_.hooks.on_evaluate) s_.hooks.on_evaluate(step, *e);
  }
  if (stop)
    progress.message(cat("step ", step, ": early stopping: ", s_.c.early_stopping_patience,
                         " evaluations in a row without a validation loss below the best",
                         s_.c.early_stopping_threshold > 0 ? cat(" by more than ", s_.c.early_stopping_threshold) : "",
                         " (", format_loss(state_.best_eval.loss), " at step ", state_.best_eval.step, ")"));
  return stop;
}

void TrainLoop::restore_best(ProgressLine& progress) {
  const BestEval best = state_.best_eval;
  if (!best_at_end_ || best.step <= 0 || best.step == state_.step) return;  // the model in hand is the best
  const fs::path dir = s_.c.output_dir / cat("checkpoint-", best.step);
  if (!fs::is_directory(dir)) {  // (removed by hand since: said, not hidden)
    progress.message(
        cat("load_best_model_at_end: ", dir.string(), " is gone; the final model is step ", state_.step, "'s"));
    return;
  }
  const int64_t step = state_.step;
  restore_from(dir);
  state_.step = step;  // (the count of updates run stays; the weights are the best's)
  progress.message(cat("load_best_model_at_end: the final model is ", dir.string(), "'s (validation loss ",
                       format_loss(best.loss), ", the lowest)"));
}

bool TrainLoop::background_saves() const {
  // ZeRO-3 saves stay in step: rank 0 writes the masters gathered whole, a collective per group.
  return s_.c.background_checkpoints && !zero3() && s_.cadence.save_steps > 0;
}

void TrainLoop::warm_snapshots() {
  if (!background_saves()) return;
  // Data parallel: the shards' folder is named for the job, alike on every rank (rank 0's PID).
  if (s_.dp) job_ = s_.comm->all_max_host(lead() ? int64_t(::getpid()) : 0);
  try {  // taken and dropped: its buffers stay in the pool, its staged folder goes
    snapshot(s_.c.output_dir / "checkpoint-warmup");
  } catch (const UserError&) {  // no room: the first checkpoint says so and is written directly
  }
}

std::unique_ptr<PendingCheckpoint> TrainLoop::snapshot(const fs::path& dir) {
  return snapshot_checkpoint(dir, s_.c, s_.model, s_.step.optimizer(), state_, &snapshots_, s_.dp ? s_.comm : nullptr,
                             job_, s_.c.ddp_timeout);
}

std::optional<int64_t> TrainLoop::wait_for_writer() {
  // Data parallel: rank 0's writer waits for the others' shards, which live ranks write; a dead rank is found
  // here (the barrier fails at once) rather than by that wait running to ddp_timeout. The barrier after it:
  // no rank goes on (to list the checkpoints, in a recovery) before rank 0 has committed.
  if (s_.dp) s_.comm->barrier();
  const std::optional<int64_t> step = writer_.wait();
  if (s_.dp) s_.comm->barrier();
  return step;
}

void TrainLoop::saved(std::optional<int64_t> step, ProgressLine& progress) {
  if (!step) return;
  last_saved_ = *step;
  const fs::path dir = s_.c.output_dir / cat("checkpoint-", *step);
  progress.message(cat("step ", *step, ": saved ", dir.string()));
  if (hub_) hub_->checkpoint_saved(dir, *step);  // (a pruned checkpoint's push fails with a warning)
  if (lead()) prune_checkpoints(s_.c.output_dir, s_.c.save_total_limit, best_at_end_ ? state_.best_eval.step : -1);
}

void TrainLoop::checkpoint(ProgressLine& progress, bool background) {
  s_.step.settle();                    // the weights whole before they are written
  saved(wait_for_writer(), progress);  // one checkpoint in flight at a time
  state_.loader = driver_.loader_state();
  const fs::path dir = s_.c.output_dir / cat("checkpoint-", state_.step);
  if (background && background_saves()) {
    std::unique_ptr<PendingCheckpoint> p;
    try {
      p = snapshot(dir);
    } catch (const UserError& e) {  // no room for the snapshot: written from the device instead
      progress.message(cat("step ", state_.step, ": ", e.what(), "; writing this checkpoint directly"));
    }
    // Ranks write in the background together or directly together (save_checkpoint's barriers).
    if (s_.dp && s_.comm->all_max_host(p ? 0 : 1) > 0) p.reset();
    if (p) return writer_.start(std::move(p), state_.step);
  }
  save_checkpoint(dir, s_.c, s_.model, s_.step.optimizer(), state_, s_.dp ? s_.comm : nullptr, zero3());
  saved(state_.step, progress);
}

bool TrainLoop::recover(const Divergence& d, ProgressLine& progress) {
  // Data parallel: every rank comes here at the same step (the check is agreed in StepLogger), restores the same
  // checkpoint (each its shards) and passes over its own batches of the bad update.
  if (!d.nonfinite) return false;  // (the caller has waited for the checkpoint in flight)
  const std::vector<fs::path> kept = list_checkpoints(s_.c.output_dir);
  if (kept.empty()) return false;
  if (check_until_ == 0) {
    if (recoveries_ >= s_.c.skip_bad_batches) return false;
    // Which update it was: the loss is read on logged steps only, so the updates since the newest checkpoint
    // are trained again (bitwise the same) with every one checked.
    restore_from(kept.back());
    check_until_ = d.step;
    progress.message(cat("step ", d.step, ": ", d.why, "; restored ", kept.back().string(),
                         " to find the update that diverged (skip_bad_batches)"));
    return true;
  }
  // Update d.step diverged (every step is checked now): once more from the checkpoint, then without its batches.
  bad_step_ = d.step;
  bad_loader_ = driver_.loader_state();  // past that update's batches
  restore_from(kept.back());
  check_until_ = 0;
  ++recoveries_;
  return true;
}

RunResult TrainLoop::run() {
  const TrainConfig& c = s_.c;
  g_test_poisoned = false;  // (a test's earlier run in this process may have ended poisoned)
  // The test seams, read once per run rather than at every step.
  const char* fault_seam = std::getenv("SOLTRAIN_TEST_RANK_FAULT");
  const NanSeam nan_seam = read_nan_seam();
  std::optional<MetricsLog> metrics_file;
  if (lead() && c.trackers.any()) trackers_ = std::make_unique<TrackerBridge>(c, s_.log);
  if (lead()) metrics_file.emplace(c.output_dir, state_.step, c.tensorboard, trackers_.get());
  if (lead() && c.hub.enabled) hub_ = std::make_unique<HubPusher>(c, s_.log);
  MetricsLog* metrics = metrics_file ? &*metrics_file : nullptr;
  ProgressLine progress(s_.log);
  RunResult result;
  result.total_steps = state_.total_steps;
  result.first_eval_loss = result.last_eval_loss = NAN;
  if (state_.step == 0) {
    evaluate_at(0, metrics, progress, result);
    result.first_eval_loss = result.last_eval_loss;
  }
  // The step logger's: a full disk stops the run after this. Data-parallel ranks checkpoint together, and the
  // others are already in the next step, so rank 0 (the one that writes the logs) cannot save alone.
  auto save_on_failed_write = [&] {
    if (s_.dp)
      user_error(
          "data-parallel ranks checkpoint together and the others have gone on, so the newest checkpoint "
          "stays the one to resume from");
    checkpoint(progress, /*background=*/false);
  };
  warm_snapshots();
  StepLogger step_log(s_, driver_, state_, metrics, progress, save_on_failed_write);
  StopSignal stop;
  // Every rank stops at the same step: a stop seen by any stops all (after the same update).
  auto stop_requested = [&] {
    const bool here = StopSignal::requested() || (s_.hooks.should_stop && s_.hooks.should_stop());
    return s_.dp ? s_.comm->all_max_host(here ? 1 : 0) > 0 : here;
  };
  const int rank = s_.comm ? s_.comm->rank() : 0;
  bool stopping = false;
  while (state_.step < state_.total_steps && !(stopping = stop_requested())) {
    if (state_.step + 1 == bad_step_) {  // the update that diverged: its batches are passed over
      driver_.restore(bad_loader_);
      ++state_.step;
      bad_step_ = 0;
      progress.message(cat("step ", state_.step, ": skipped (its loss or gradient was not finite)"));
      continue;
    }
    const auto t0 = Clock::now();
    const double lr = c.learning_rate * lr_factor(s_.sched, state_.step);
    driver_.update(s_.step, state_.step, float(lr));
    ++state_.step;
    test_fault(fault_seam, rank, state_.step);
    test_poison(nan_seam, rank, state_.step);
    const bool save_step = s_.cadence.save_steps > 0 && state_.step % s_.cadence.save_steps == 0;
    try {
      step_log.after_update(lr, t0, save_step || state_.step <= check_until_);
    } catch (const Divergence& d) {
      // The checkpoint being written is from before the divergence: whole first (on rank 0, which commits it,
      // before any rank lists the checkpoints), and named in the line.
      saved(wait_for_writer(), progress);
      if (!recover(d, progress)) throw Divergence(d.why, d.learning_rate, c.output_dir, d.step, d.nonfinite);
      if (metrics)
        metrics_file.emplace(c.output_dir, state_.step, c.tensorboard,
                             trackers_.get());  // the lines past the checkpoint go
      continue;
    }
    if (state_.step >= check_until_) check_until_ = 0;  // replayed to the divergence without meeting it again
    bool stop_early = false;
    if (s_.cadence.eval_steps > 0 && state_.step % s_.cadence.eval_steps == 0 && state_.step < state_.total_steps)
      stop_early = evaluate_at(state_.step, metrics, progress, result);
    if (save_step) checkpoint(progress, /*background=*/true);
    saved(writer_.finished(), progress);
    if (stop_early) {
      result.stopped_early = true;
      break;
    }
  }
  result.steps = state_.step;
  s_.step.settle();
  saved(wait_for_writer(), progress);
  if (stopping) {
    if (state_.step > last_saved_) checkpoint(progress, /*background=*/false);  // every rank stops here together
    if (metrics) write_training_curves(metrics->jsonl_path(), c.output_dir / "training_curves.svg");
    progress.message(cat(s_.cmd, ": stopped ",
                         StopSignal::signal_number() ? cat("by signal ", StopSignal::signal_number()) : "as asked",
                         " at step ", state_.step, "; resume with resume_from_checkpoint: true"));
    result.interrupted = true;
    return result;
  }
  if (last_eval_step_ != state_.step) evaluate_at(state_.step, metrics, progress, result);
  restore_best(progress);
  // ZeRO-3: rank 0 writes the model as the other ranks serve its groups' gathers (Zero3::begin_masters)
  if (zero3() && !lead()) zero3()->serve_masters();
  if (lead()) {
    if (zero3()) zero3()->begin_masters();
    std::string outputs = save_final_outputs(c, s_.model, c.lora.enabled);
    if (zero3()) zero3()->end_masters();
    std::string summary = cat(s_.cmd, ": done, ", state_.step, " steps; ", outputs);
    write_training_curves(metrics->jsonl_path(), c.output_dir / "training_curves.svg");
    if (hub_) hub_->push_final(c.output_dir / (c.lora.enabled ? "adapter" : "model"), state_.step);
    if (driver_.has_validation())
      summary +=
          cat("; validation loss ", format_loss(result.first_eval_loss), " -> ", format_loss(result.last_eval_loss));
    progress.message(summary);
  }
  if (s_.dp) s_.comm->barrier();  // no rank reports done before the model is written
  return result;
}

}  // namespace soltrain
