#include "train/output_guard.h"

#include "io/output_dir.h"
#include "io/stale_partials.h"

namespace fs = std::filesystem;

namespace soltrain {

OutputLock prepare_run_outputs(const TrainConfig& c, std::ostream& log) {
  check_output_dir(c.output_dir, c.overwrite_output_dir, "overwrite_output_dir: true", "run (output_dir)");
  if (c.dataset_prepared_path != c.output_dir / "prepared")
    check_output_dir(c.dataset_prepared_path, c.overwrite_output_dir, "overwrite_output_dir: true",
                     "tokenized shards (dataset_prepared_path)");
  std::vector<std::pair<fs::path, std::string>> inputs = {{c.model, "model"}};
  for (const auto* list : {&c.datasets, &c.validation_datasets})
    for (const DatasetSpec& d : *list) inputs.emplace_back(d.path, "dataset");
  // What the run replaces as a whole: the final model or adapter, the shard cache. Checkpoints are replaced
  // too, but a resume reads one on purpose, so only the model and datasets are checked against them.
  const fs::path saved = c.output_dir / (c.lora.enabled ? "adapter" : "model");
  check_output_apart_from_inputs(saved, "output_dir", inputs);
  check_output_apart_from_inputs(c.dataset_prepared_path, "dataset_prepared_path", inputs);
  for (const auto& [in, key] : inputs) {
    std::error_code ec;
    const fs::path rel = fs::weakly_canonical(fs::absolute(in), ec)
                             .lexically_relative(fs::weakly_canonical(fs::absolute(c.output_dir), ec));
    if (!rel.empty() && rel.begin()->string().rfind("checkpoint-", 0) == 0)
      user_error(key, " ", in.string(), " is inside ", (c.output_dir / *rel.begin()).string(),
                 ", which this run may replace or prune; copy it elsewhere or choose another output_dir");
  }

  fs::create_directories(c.output_dir);
  OutputLock lock = OutputLock::acquire(c.output_dir, "output_dir");  // before anything in it is touched
  mark_output_dir(c.output_dir, "training run");
  clean_stale_partials(c.output_dir, log);
  fs::create_directories(c.dataset_prepared_path);
  mark_output_dir(c.dataset_prepared_path, "tokenized shards");
  clean_stale_partials(c.dataset_prepared_path, log);
  return lock;
}

}  // namespace soltrain
