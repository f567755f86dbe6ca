// The one training loop every objective runs in (sft, pt, dpo; GRPO and distillation next): resume, the
// updates with their schedule, logging and metrics files, evaluation, checkpoints, stop signals, the final
// save. What differs between objectives (their batches, their update, what they read back and how they
// evaluate) is a RunDriver plugged into it; everything else is written here once.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/loader.h"
#include "dist/communicator.h"
#include "model/transformer.h"
#include "train/background_save.h"
#include "train/hub_push.h"
#include "train/loss_watchdog.h"
#include "train/metrics.h"
#include "train/run_builder.h"
#include "train/train_checkpoint.h"
#include "train/train_config.h"
#include "train/train_step.h"

namespace soltrain {

struct RunResult {
  int64_t steps = 0, total_steps = 0;
  double first_eval_loss = 0, last_eval_loss = 0;  // NaN without a validation set
  bool interrupted = false;                        // stopped by SIGINT / SIGTERM (or the caller) after a checkpoint
  bool stopped_early = false;                      // early_stopping_patience ended it (the final save was made)
};

using NamedValues = std::vector<std::pair<std::string, double>>;

class RunDriver {
 public:
  virtual ~RunDriver() = default;
  // One optimizer update at learning rate `lr` through `step`; `done` updates came before it.
  virtual void update(TrainStep& step, int64_t done, float lr) = 0;
  // The last update's loss (NaN when nothing was counted), whether it counted anything, and the objective's
  // own values under their TRL names: read back from the device (a sync).
  struct Readout {
    double loss = 0;
    bool counted = false;
    NamedValues extra;
  };
  virtual Readout read(const TrainStep& step) = 0;
  virtual double tokens_per_update() const = 0;  // rows x sequence_len of one update on every rank (tok/s)
  virtual double epoch() const = 0;              // epochs of data consumed, fractional
  virtual LoaderState loader_state() const = 0;
  virtual void restore(const LoaderState& s) = 0;
  // The validation set's loss and values, and the line that reports them; nullopt when there is no validation
  // set, or when this rank does not report (data parallel: rank 0 does).
  struct Evaluation {
    double loss = 0;
    int64_t tokens = 0;
    NamedValues extra;
    std::string line;  // "validation loss 1.2345 over 678 tokens" (after "step N: ")
  };
  virtual bool has_validation() const = 0;
  virtual std::optional<Evaluation> evaluate() = 0;
  virtual const char* order_name() const { return "data order"; }  // what a different seed would change
};

// Hooks for a caller that drives the run from code (the Python Trainer): every logged step's metrics, and a
// stop asked for between updates (checkpointed and reported as interrupted, as a signal is).
struct LoopHooks {
  std::function<void(const StepMetrics&)> on_log;
  std::function<void(int64_t step, const RunDriver::Evaluation&)> on_evaluate;
  std::function<bool()> should_stop;
};

struct LoopSetup {
  const TrainConfig& c;
  const char* cmd;    // "sft", "pt", "dpo": the log lines' prefix
  std::ostream& log;  // rank 0's log; other ranks get one that prints nothing
  Ops& ops;
  Communicator* comm = nullptr;  // data parallel (dp); null in a single process
  bool dp = false;
  Transformer& model;
  TrainStep& step;
  ScheduleConfig sched;
  Cadence cadence;
  LoopHooks hooks;
};

class TrainLoop {
 public:
  TrainLoop(LoopSetup s, RunDriver& driver);
  // resume_from_checkpoint: loads the weights, optimizer and loader state and the step, or says why the run
  // starts fresh. Call before the loop (and before printing the plan, which shows the step).
  void resume();
  const TrainerState& state() const { return state_; }
  // The updates through the final save; returns early, checkpointed, on a stop signal.
  RunResult run();

 private:
  bool lead() const { return !s_.comm || s_.comm->rank() == 0; }
  Zero3* zero3() const { return s_.step.data_parallel() ? s_.step.data_parallel()->zero3() : nullptr; }
  // An evaluation after update `step` (0: before the first); whether early stopping ends the run there (every rank
  // the same answer).
  bool evaluate_at(int64_t step, MetricsLog* metrics, ProgressLine& progress, RunResult& result);
  // load_best_model_at_end: the checkpoint of the lowest validation loss restored before the final save (said).
  void restore_best(ProgressLine& progress);
  // `background`: from a host snapshot by a writer thread (background_checkpoints; not ZeRO-3), else written
  // before it returns.
  void checkpoint(ProgressLine& progress, bool background);
  // Whether checkpoints are written in the background (background_checkpoints, save_steps > 0, not ZeRO-3).
  bool background_saves() const;
  // The snapshot buffers (pinned on CUDA) allocated before the first step, by one snapshot taken and dropped,
  // rather than at the first checkpoint: a checkpoint then costs the step only its copies.
  void warm_snapshots();
  std::unique_ptr<PendingCheckpoint> snapshot(const std::filesystem::path& dir);
  // The checkpoint in flight written (and, data parallel, every rank's part of it); its step, else nothing.
  std::optional<int64_t> wait_for_writer();
  // A checkpoint whole on disk (the step `saved`, or none): counted, older ones pruned, said.
  void saved(std::optional<int64_t> step, ProgressLine& progress);
  // Weights, optimizer, loader position and step from checkpoint `from`.
  void restore_from(const std::filesystem::path& from);
  // skip_bad_batches after a NaN / inf at d.step: restores the newest checkpoint and either replays with every
  // update checked (to find the one) or, that one found, sets it to be skipped. False: the run stops.
  bool recover(const Divergence& d, ProgressLine& progress);

  LoopSetup s_;
  RunDriver& driver_;
  TrainerState state_;
  int64_t last_saved_ = 0;
  SnapshotPool snapshots_{[this](size_t n) { return s_.ops.alloc_host(n); }};  // outlives writer_
  int64_t job_ = 0;  // data parallel: names the shards' folder of background checkpoints (rank 0's PID)
  BackgroundSave writer_;
  EarlyStopping early_;
  bool best_at_end_ = false;  // load_best_model_at_end, as asked or as its default resolved
  int64_t last_eval_step_ = -1;
  int64_t check_until_ = 0;  // replaying after a divergence: every update through this one is checked
  int64_t bad_step_ = 0;     // the update to skip (its batches passed over), 0 for none
  LoaderState bad_loader_;   // the loader past that update's batches
  int recoveries_ = 0;
  std::unique_ptr<HubPusher> hub_;           // push_to_hub, rank 0
  std::unique_ptr<TrackerBridge> trackers_;  // report_to: wandb / mlflow, rank 0
};

}  // namespace soltrain
