// Stops a run that has gone wrong: a NaN or infinite loss or gradient norm at once, and, with Axolotl's
// loss_watchdog_threshold, a loss above the threshold for loss_watchdog_patience steps in a row.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "core/error.h"

namespace soltrain {

// The watchdog's stop: a UserError (one line, exit 2) that says which step and whether it was a NaN or
// infinite value (which the loop may recover from: skip_bad_batches) or the threshold.
struct Divergence : UserError {
  Divergence(const std::string& why, double learning_rate, const std::filesystem::path& output_dir, int64_t step,
             bool nonfinite);
  std::string why;  // "training diverged at step 8 (loss nan)"
  double learning_rate;
  int64_t step;
  bool nonfinite;
};

class LossWatchdog {
 public:
  // threshold <= 0 turns the threshold check off (the non-finite check always runs); patience >= 1.
  LossWatchdog(double threshold, int patience) : threshold_(threshold), patience_(patience) {}

  // After optimizer step `step`: why the run must stop, or nothing. `counted` is false when the step
  // trained no token (its loss is undefined and not a sign of divergence).
  std::optional<std::string> check(int64_t step, double loss, double grad_norm, bool counted);

  // check(), and on a stop a UserError naming the step, a hint, and the checkpoint the run leaves behind
  // (the newest in `output_dir`: no checkpoint is saved after a bad step, so none holds its weights).
  void after_step(int64_t step, double loss, double grad_norm, bool counted, double learning_rate,
                  const std::filesystem::path& output_dir);

 private:
  double threshold_;
  int patience_;
  int over_ = 0;  // consecutive steps above the threshold
};

}  // namespace soltrain
