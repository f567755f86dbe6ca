#include "train/hub_push.h"

#include "core/error.h"

namespace soltrain {

namespace fs = std::filesystem;

namespace {

// What of a checkpoint is the model (pushed to the repository's top by every_save): the optimizer, the resume
// state and the local config (absolute local paths) stay home.
bool model_file(const std::string& name) {
  return !name.starts_with("optimizer") && name != "soltrain_state.json" && name != "fp8_state.safetensors" &&
         name != "checksums.sha256" && name != "config.yaml" && name != "trainer_state.json";
}

}  // namespace

HubPusher::HubPusher(const TrainConfig& c, std::ostream& log)
    : client_(hub_client_from_env(log, false)), strategy_(c.hub.strategy), log_(log) {
  repo_.id = c.hub.model_id;
  if (!client_.token)
    user_error(
        "push_to_hub: no Hugging Face token: set HF_TOKEN (or run `huggingface-cli login`) to a token with "
        "write access to ",
        repo_.id);
  create_repo(client_, repo_, c.hub.private_repo);
  log_ << "push_to_hub: " << repo_.id << " (" << strategy_ << ") on " << url_for_messages(client_.endpoint) << "\n";
  thread_ = std::thread([this] { work(); });
}

HubPusher::~HubPusher() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string HubPusher::push(const Job& j) {
  return upload_files(client_, repo_, j.files, j.message);
}

void HubPusher::work() {
  for (;;) {
    Job j;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || waiting_; });
      if (!waiting_) return;  // stopping, nothing left
      j = std::move(*waiting_);
      waiting_.reset();
      busy_ = true;
    }
    std::string line;
    try {
      line = cat("push_to_hub: ", j.message, " -> ", repo_.id, " (commit ", push(j).substr(0, 12), ")");
    } catch (const std::exception& e) {  // (a checkpoint pruned mid-upload, the network): the next push carries it
      line = cat("warning: push_to_hub: ", j.message, " was not pushed: ", e.what());
    }
    std::lock_guard<std::mutex> l(mu_);
    log_ << line << "\n";
    busy_ = false;
    cv_.notify_all();
  }
}

void HubPusher::checkpoint_saved(const fs::path& dir, int64_t step) {
  if (strategy_ == "end") return;
  Job j;
  for (UploadFile& f : folder_files(dir))
    if (model_file(f.path_in_repo)) j.files.push_back(std::move(f));  // the model at the top
  if (strategy_ == "checkpoint" || strategy_ == "all_checkpoints") {
    const std::string folder = strategy_ == "checkpoint" ? "last-checkpoint/" : cat("checkpoint-", step, "/");
    for (UploadFile& f : folder_files(dir, folder))
      if (!f.path_in_repo.ends_with("/config.yaml")) j.files.push_back(std::move(f));
  }
  j.message = cat("checkpoint-", step);
  {
    std::lock_guard<std::mutex> l(mu_);
    waiting_ = std::move(j);
  }
  cv_.notify_all();
}

void HubPusher::push_final(const fs::path& saved, int64_t steps) {
  {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !waiting_ && !busy_; });
  }
  const Job j{folder_files(saved), cat("end of training (", steps, " steps)")};
  const std::string commit = push(j);
  std::lock_guard<std::mutex> l(mu_);
  log_ << "push_to_hub: " << saved.filename().string() << " -> " << url_for_messages(client_.endpoint) << "/"
       << repo_.id << " (commit " << commit.substr(0, 12) << ")\n";
}

}  // namespace soltrain
