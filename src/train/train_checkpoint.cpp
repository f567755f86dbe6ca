#include "train/train_checkpoint.h"

#include <algorithm>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_file.h"
#include "model/checkpoint.h"
#include "model/peft_adapter.h"

namespace soltrain {

namespace fs = std::filesystem;

void save_checkpoint(const fs::path& dir, const TrainConfig& c, const Transformer& model, const AdamW& opt,
                     const TrainerState& s) {
  StagedDir staged(dir);
  // save_pretrained / save_adapter stage their own folder, so the weights go one level down inside ours.
  if (c.lora.enabled)
    save_adapter(model, staged.path() / "adapter", c.model.string());
  else
    save_pretrained(model, staged.path() / "model", c.model);
  opt.save(staged.path() / "optimizer.safetensors");
  const nlohmann::json state = {{"step", s.step},
                                {"total_steps", s.total_steps},
                                {"loader", s.loader.to_json()},
                                {"seed", s.seed},
                                {"lr_scheduler_type", to_string(c.lr_scheduler_type)},
                                {"learning_rate", c.learning_rate}};
  write_file_atomic(staged.path() / "trainer_state.json", state.dump(2) + "\n");
  write_file_atomic(staged.path() / "config.yaml", c.source_text);
  staged.commit();
}

TrainerState load_checkpoint(const fs::path& dir, Transformer& model, AdamW& opt) {
  const bool lora = model.lora().has_value();
  for (const char* f : {"trainer_state.json", "optimizer.safetensors", lora ? "adapter" : "model"})
    if (!fs::exists(dir / f)) user_error(dir.string(), ": not a soltrain checkpoint of this kind (no ", f, ")");
  const nlohmann::json j = read_json_file(dir / "trainer_state.json");
  TrainerState s;
  try {
    s.step = j.at("step").get<int64_t>();
    s.total_steps = j.at("total_steps").get<int64_t>();
    s.seed = j.at("seed").get<uint64_t>();
    s.loader = LoaderState::from_json(j.at("loader"));
  } catch (const nlohmann::json::exception& e) {
    user_error((dir / "trainer_state.json").string(), ": malformed (", e.what(), ")");
  }
  if (lora)
    load_adapter_weights(model, dir / "adapter");
  else
    load_weights(model, dir / "model");
  model.set_dropout_step(s.step);  // the dropout masks continue where the interrupted run was
  opt.load(dir / "optimizer.safetensors");
  if (opt.steps_done() != s.step)
    user_error(dir.string(), ": optimizer step ", opt.steps_done(), " does not match trainer step ", s.step);
  return s;
}

std::vector<fs::path> list_checkpoints(const fs::path& output_dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || !name.starts_with("checkpoint-")) continue;
    const std::string digits = name.substr(11);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    found.emplace_back(std::stoll(digits), e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [n, p] : found) out.push_back(p);
  return out;
}

void prune_checkpoints(const fs::path& output_dir, int keep) {
  if (keep <= 0) return;
  const std::vector<fs::path> all = list_checkpoints(output_dir);
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) fs::remove_all(all[i]);
}

std::optional<fs::path> resolve_resume(const TrainConfig& c) {
  const ResumeFrom& r = c.resume_from_checkpoint;
  if (r.kind == ResumeFrom::kFresh) return std::nullopt;
  if (r.kind == ResumeFrom::kLatest) {
    const std::vector<fs::path> all = list_checkpoints(c.output_dir);
    if (all.empty()) return std::nullopt;
    return all.back();
  }
  const fs::path& p = r.folder;
  if (!fs::is_directory(p)) user_error("resume_from_checkpoint: ", p.string(), " is not a folder");
  return p;
}

}  // namespace soltrain
