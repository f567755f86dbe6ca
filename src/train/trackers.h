// Experiment trackers through their own Python libraries (report_to: wandb / mlflow, Axolotl's wandb_project,
// mlflow_tracking_uri, ...): a python3 process runs python/soltrain/trackers.py (compiled in), started and ready
// before the first step (a tracker that is not installed or does not start stops the run then, in one line),
// then fed every metrics.jsonl row as it is written. If it dies mid-run the run goes on (metrics.jsonl has
// every row) with a warning.
#pragma once
#include <sys/types.h>

#include <cstdio>
#include <ostream>
#include <string>

#include "train/train_config.h"

namespace soltrain {

class TrackerBridge {
 public:
  TrackerBridge(const TrainConfig& c, std::ostream& log);
  ~TrackerBridge();  // closes its input and waits for the trackers to finish (they upload or sync then)
  TrackerBridge(const TrackerBridge&) = delete;
  TrackerBridge& operator=(const TrackerBridge&) = delete;
  void row(const std::string& json_line);

 private:
  std::ostream& log_;
  pid_t pid_ = -1;
  std::FILE* in_ = nullptr;  // the bridge's stdin
  bool broken_ = false;
};

}  // namespace soltrain
