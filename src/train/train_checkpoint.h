// Training checkpoints: output_dir/checkpoint-<step>/ holds the trained model as HF Trainer's checkpoint-N does
// (a full fine-tune's transformers folder of the fp32 masters, or a LoRA run's PEFT adapter, with tokenizer files
// and a model card: PEFT and transformers load the folder as it is), optimizer.safetensors (AdamW moments and
// step), soltrain_state.json (step, loader position, seed, schedule: what a resume reads), HF's
// trainer_state.json (global_step, log_history), config.yaml (the run's settings, re-runnable) and
// checksums.sha256 (every file's sha256, `sha256sum -c` format, verified at resume).
// Each is written whole under a temporary name, then renamed into place.
// Data parallel with a sharded optimizer (ZeRO-1/2): optimizer-shard-<r>-of-<n>.safetensors, one per rank,
// each holding its ranges of the flat moments (train/optimizer.h); any rank count resumes from them.
#pragma once
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "data/loader.h"
#include "dist/communicator.h"
#include "io/atomic_file.h"
#include "io/deferred_writes.h"
#include "model/transformer.h"
#include "train/early_stopping.h"
#include "train/optimizer.h"
#include "train/train_config.h"

namespace soltrain {

class Zero3;

struct TrainerState {
  int64_t step = 0, total_steps = 0;
  LoaderState loader;
  uint64_t seed = 0;
  BestEval best_eval;            // early stopping and load_best_model_at_end
  size_t weight_bytes_read = 0;  // load_checkpoint: the model's weights this rank read (not saved)
};

// With `comm` (world size > 1) every rank calls it: rank 0 writes the model and the state, each rank its
// optimizer shard; it returns on every rank once the checkpoint is complete. With `zero3` rank 0 reads the
// weights group by group as the other ranks serve its gathers (Zero3::begin_masters): none holds them whole.
void save_checkpoint(const std::filesystem::path& dir, const TrainConfig& c, const Transformer& model, const AdamW& opt,
                     const TrainerState& s, Communicator* comm = nullptr, Zero3* zero3 = nullptr);

// Background checkpoints: snapshot_checkpoint copies the state into host memory and stages the folder's small
// files on the calling thread (the step waits only for that); finish_checkpoint writes the snapshot's tensor
// files, the checksums, and renames the folder into place, on any thread. Until then the previous checkpoint is
// the latest complete one: a crash mid-write leaves it, and the staged folder is cleaned up by the next run.
// Data parallel (ZeRO 0-2; every rank calls it at the same step): rank 0 snapshots what save_checkpoint's rank 0
// writes; with sharded moments each rank also snapshots its shard and writes it into `shards`, a folder beside
// the checkpoint named for the job, and rank 0's writer moves all of them in before it commits (it waits for
// them up to `timeout_s`, or until cancelled). The other ranks count their checkpoint written once their shard is.
struct PendingCheckpoint {
  PendingCheckpoint(const std::filesystem::path& dir, SnapshotPool* pool, bool lead = true);
  ~PendingCheckpoint();  // (a snapshot dropped unwritten waits for its queued copies before its buffers go back)
  std::optional<StagedDir> staged;  // rank 0 (or the one process): the checkpoint's folder
  DeferredWrites writes;
  std::filesystem::path final_dir;
  // The snapshot's device copies were queued into the pinned slabs, not waited for (no sync per tensor): this
  // returns once they are done (called once, by finish_checkpoint, from the writer thread).
  std::function<void()> copies_done;
  std::filesystem::path shards;  // sharded moments: where every rank's shard goes (empty: none)
  int rank = 0, world = 1, timeout_s = 1800;
  std::atomic<bool> cancelled{false};  // rank 0 stops waiting for the others' shards (the job is ending)
};
// `pool`: the snapshot's host buffers (pinned, kept from one checkpoint to the next). `comm`: data parallel
// (ZeRO 0-2), with `job` naming the shards' folder alike on every rank (rank 0's PID, so a killed job's
// leftovers are cleaned up as stale partials) and `timeout_s` bounding rank 0's wait for them (ddp_timeout).
std::unique_ptr<PendingCheckpoint> snapshot_checkpoint(const std::filesystem::path& dir, const TrainConfig& c,
                                                       const Transformer& model, const AdamW& opt,
                                                       const TrainerState& s, SnapshotPool* pool,
                                                       Communicator* comm = nullptr, int64_t job = 0,
                                                       int timeout_s = 1800);
void finish_checkpoint(PendingCheckpoint& p);

// Loads weights, optimizer state and returns the trainer state; UserError naming what is missing.
TrainerState load_checkpoint(const std::filesystem::path& dir, Transformer& model, AdamW& opt);

// checkpoint-<N> folders of output_dir, oldest (smallest N) first.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& output_dir);

// Removes the oldest checkpoints beyond `keep` (0 keeps all). checkpoint-<protect> (load_best_model_at_end's best)
// is kept and counts among them, as the Trainer keeps its best; with keep 1 and an older best that makes two.
void prune_checkpoints(const std::filesystem::path& output_dir, int keep, int64_t protect = -1);

// resume_from_checkpoint → the folder to resume from, or nothing ("" or "true" with no checkpoint yet).
std::optional<std::filesystem::path> resolve_resume(const TrainConfig& c);

}  // namespace soltrain
