#include "train/background_save.h"

#include <exception>

#include "core/error.h"

namespace soltrain {

BackgroundSave::~BackgroundSave() {
  // Unwinding (a rank failed, a stop by error): rank 0's writer stops waiting for the others' shards, and the
  // unfinished checkpoint is abandoned (its staged folder goes; the previous one stays the newest).
  if (pending_ && std::uncaught_exceptions() > 0) pending_->cancelled = true;
  if (thread_.joinable()) thread_.join();
}

void BackgroundSave::start(std::unique_ptr<PendingCheckpoint> p, int64_t step) {
  SOLTRAIN_CHECK(!thread_.joinable(), "a checkpoint is still being written");
  pending_ = std::move(p);
  step_ = step;
  done_ = false;
  error_ = nullptr;
  thread_ = std::thread([this] {
    try {
      finish_checkpoint(*pending_);
    } catch (...) {
      error_ = std::current_exception();
    }
    done_ = true;
  });
}

std::optional<int64_t> BackgroundSave::finished() {
  if (!thread_.joinable() || !done_) return std::nullopt;
  return wait();
}

std::optional<int64_t> BackgroundSave::wait() {
  if (!thread_.joinable()) return std::nullopt;
  thread_.join();
  pending_.reset();  // the snapshot's host memory goes back now
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return step_;
}

}  // namespace soltrain
