// YAML training configs (Axolotl-style keys) → TrainConfig. Unknown keys are errors with the closest
// known key; bad values name the key, the value and what is expected.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "train/train_config.h"

namespace soltrain {

// `overrides` are "key=value" strings (--set), applied after the file; values are YAML scalars or flow
// collections. `mode` decides the defaults and checks that depend on sft vs pt.
TrainConfig load_train_config(const std::filesystem::path& file, const std::vector<std::string>& overrides,
                              TrainMode mode);
// The same from YAML text; `where` names it in errors.
TrainConfig parse_train_config(const std::string& yaml, const std::string& where,
                               const std::vector<std::string>& overrides, TrainMode mode);

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace soltrain
