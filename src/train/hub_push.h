// Pushing a run's outputs to the Hugging Face hub as HF Trainer does (push_to_hub / hub_model_id,
// hub_strategy, hub_private_repo): the repository is created (or found) when the run starts, so a missing token
// or a refused name stops it before training; checkpoints are uploaded by a thread of their own while training
// goes on (a failed one is a warning: the next push carries the files again); the final model or adapter at the
// end, waited for, a failure there an error after the local output is saved.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "hub/hub_upload.h"
#include "train/train_config.h"

namespace soltrain {

class HubPusher {
 public:
  HubPusher(const TrainConfig& c, std::ostream& log);
  ~HubPusher();
  HubPusher(const HubPusher&) = delete;
  HubPusher& operator=(const HubPusher&) = delete;

  // Checkpoint `dir` of `step` is complete: what hub_strategy pushes of it is queued (the newest waiting
  // push replaces an older one that has not started).
  void checkpoint_saved(const std::filesystem::path& dir, int64_t step);
  // The final model or adapter folder at the repository's top, after the queue has drained; UserError on failure.
  void push_final(const std::filesystem::path& saved, int64_t steps);

 private:
  struct Job {
    std::vector<UploadFile> files;
    std::string message;
  };
  void work();
  std::string push(const Job& j);

  HubClient client_;
  RepoRef repo_;
  std::string strategy_;
  std::ostream& log_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Job> waiting_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace soltrain
