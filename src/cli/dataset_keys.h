// A config's `datasets` / `validation_datasets` entries: a path, or a map of keys (path, type, the fields'
// names in Axolotl's, Surogate's and TRL's spellings, splits and slices, system prompts, roles, templates).
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "cli/config_values.h"
#include "train/train_config.h"

namespace soltrain {

// The problems of one or more dataset entries; the config reader lists each of them.
struct DatasetErrors : UserError {
  std::vector<std::string> all;
  explicit DatasetErrors(std::vector<std::string> e) : UserError(e.front()), all(std::move(e)) {}
};

// One entry (`where` names it); DatasetErrors with every problem of it.
DatasetSpec parse_dataset(const YAML::Node& n, const std::string& where, const std::string& file, TrainMode mode);
// The list under `key`; relative paths resolved against `base` (the config's folder), hub ids recognised.
std::vector<DatasetSpec> parse_datasets(const Entry& e, const std::string& key, const std::string& file, TrainMode mode,
                                        const std::filesystem::path& base);
std::vector<std::string> dataset_key_names();

}  // namespace soltrain
