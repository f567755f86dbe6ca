#include "train/loss_watchdog.h"

#include <cmath>

#include "core/error.h"
#include "train/train_checkpoint.h"

namespace soltrain {

namespace {
// The line: what happened, a hint, and the newest complete checkpoint (from before it: none is saved after a
// bad step).
std::string divergence_line(const std::string& why, double learning_rate, const std::filesystem::path& output_dir) {
  const auto kept = list_checkpoints(output_dir);
  return cat(why, ": lower learning_rate (now ", learning_rate, ") or raise warmup_steps; ",
             kept.empty() ? std::string("no checkpoint was saved")
                          : cat(kept.back().string(), " is the last checkpoint, from before it"));
}
}  // namespace

Divergence::Divergence(const std::string& why, double learning_rate, const std::filesystem::path& output_dir,
                       int64_t step, bool nonfinite)
    : UserError(divergence_line(why, learning_rate, output_dir)),
      why(why),
      learning_rate(learning_rate),
      step(step),
      nonfinite(nonfinite) {}

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
  const bool nonfinite = !std::isfinite(grad_norm) || (counted && !std::isfinite(loss));
  throw Divergence(*why, learning_rate, output_dir, step, nonfinite);
}

}  // namespace soltrain
