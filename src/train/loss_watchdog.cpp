#include "train/loss_watchdog.h"

#include <cmath>

#include "core/error.h"
#include "train/train_checkpoint.h"

namespace soltrain {

std::optional<std::string> LossWatchdog::check(int64_t step, double loss, double grad_norm, bool counted) {
  if (counted && !std::isfinite(loss)) return cat("training diverged at step ", step, " (loss ", loss, ")");
  if (!std::isfinite(grad_norm))
    return cat("training diverged at step ", step, " (gradient norm ", grad_norm, ", loss ", loss, ")");
  if (threshold_ <= 0 || !counted) return std::nullopt;
  // Like Axolotl's LossWatchDogCallback: consecutive violations, reset by any step at or below the threshold.
  over_ = loss > threshold_ ? over_ + 1 : 0;
  if (over_ < patience_) return std::nullopt;
  return cat("loss_watchdog_threshold: the loss stayed above ", threshold_, " for ", over_, " steps (", loss,
             " at step ", step, ")");
}

void LossWatchdog::after_step(int64_t step, double loss, double grad_norm, bool counted, double learning_rate,
                              const std::filesystem::path& output_dir) {
  const auto why = check(step, loss, grad_norm, counted);
  if (!why) return;
  const auto kept = list_checkpoints(output_dir);
  user_error(*why, ": lower learning_rate (now ", learning_rate, ") or raise warmup_steps; ",
             kept.empty() ? std::string("no checkpoint was saved")
                          : cat(kept.back().string(), " is the last checkpoint, from before it"));
}

}  // namespace soltrain
