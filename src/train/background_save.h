// Checkpoints written while training goes on: one at a time, by a thread of its own, from the host snapshot
// snapshot_checkpoint took (train_checkpoint.h). The loop asks finished() after every step, to count a
// checkpoint saved only once it is whole on disk, and wait()s before anything that needs it complete (the
// next checkpoint, a stop, the end of the run). A write error is rethrown on the training thread there.
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <thread>

#include "train/train_checkpoint.h"

namespace soltrain {

class BackgroundSave {
 public:
  BackgroundSave() = default;
  ~BackgroundSave();  // waits: a checkpoint being written is finished, not abandoned, while the process lives
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;

  // Starts writing `p` (the checkpoint of `step`); the previous one must be finished (wait()).
  void start(std::unique_ptr<PendingCheckpoint> p, int64_t step);
  // The step of the checkpoint that has become whole on disk since the last call, else nullopt.
  std::optional<int64_t> finished();
  // Blocks until the checkpoint in flight (if any) is written; its step, else nullopt.
  std::optional<int64_t> wait();

 private:
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
  std::unique_ptr<PendingCheckpoint> pending_;
  int64_t step_ = 0;
};

}  // namespace soltrain
