// The config a run saves with its checkpoints (config.yaml), which runs again as it is: the file as written when
// nothing needs changing (its comments kept); otherwise re-emitted with the --set overrides in place of the
// file's values (never a key twice) and relative paths made absolute (the copy lives in another folder).
#pragma once
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "cli/config_values.h"

namespace soltrain {

// `entries`: the config's keys in order with their values (overrides applied); `yaml`: the file's text;
// `base`: the folder the file's relative paths resolve from ("" = the working folder; --set values always
// resolve from there); `model_hub_id`: the model key names a hub model (no path to rewrite).
std::string saved_config_text(const std::string& yaml, const std::vector<std::pair<std::string, Entry>>& entries,
                              bool overridden, const std::filesystem::path& base, const std::string& model_hub_id);

}  // namespace soltrain
