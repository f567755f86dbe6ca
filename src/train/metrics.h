// Where a run's numbers go: output_dir/metrics.jsonl (one JSON object per logged step or evaluation),
// TensorBoard scalars in output_dir/tensorboard/, and the progress line on stderr.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "train/tfevents.h"
#include "train/trackers.h"

namespace soltrain {

struct StepMetrics {
  int64_t step = 0, total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0, epoch = 0;
  double tokens_per_s = 0, seconds_left = 0, gpu_memory_gib = 0;
  double mfu = 0;      // model FLOPs / measured matmul rate; 0 = not measured
  int64_t tokens = 0;  // counted (trained) targets of this step
  // Objective-specific values under their TRL names (DPO: rewards/chosen, rewards/accuracies, ...): written to
  // the JSONL and TensorBoard (train/<name>), the ones named in the progress line shown there too.
  std::vector<std::pair<std::string, double>> extra;
};

class MetricsLog {
 public:
  // Appends to an existing metrics.jsonl (a resumed run), first dropping lines past `resume_step`.
  // `tensorboard`: also output_dir/tensorboard's event file.
  // `trackers`: also every row to report_to's trackers.
  MetricsLog(const std::filesystem::path& output_dir, int64_t resume_step, bool tensorboard = true,
             TrackerBridge* trackers = nullptr);
  void train(const StepMetrics& m);
  void eval(int64_t step, double loss, int64_t tokens);
  // An evaluation's further values: eval_<name> in the JSONL (TRL's eval_rewards/accuracies), eval/<name> in
  // TensorBoard.
  void eval_values(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::filesystem::path& jsonl_path() const { return jsonl_; }

 private:
  void line(const std::string& json);
  std::filesystem::path jsonl_;
  std::ofstream out_;
  std::optional<TfEventsWriter> tb_;
  TrackerBridge* trackers_ = nullptr;
};

// "step 12/100 | loss 2.3456 | lr 1.00e-04 | grad 1.234 | 12.3k tok/s | mem 10.2 GiB | ETA 1m02s". On a TTY
// it is redrawn in place; otherwise one line is printed per call.
class ProgressLine {
 public:
  explicit ProgressLine(std::ostream& out);
  ~ProgressLine();  // ends a redrawn line, so an error that stopped the run gets a line of its own
  void show(const StepMetrics& m);
  void message(const std::string& text);  // a line of its own, not overwritten by the next redraw
  bool tty() const { return tty_; }

 private:
  std::ostream& out_;
  bool tty_, dirty_ = false;
};

std::string format_duration(double seconds);
// A loss as the run's lines print it: rounded to 4 decimals, "n/a" when not finite (nothing counted).
std::string format_loss(double v);

}  // namespace soltrain
