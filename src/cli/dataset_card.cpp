#include "cli/dataset_card.h"

#include <yaml-cpp/yaml.h>

#include <map>

#include "core/error.h"

namespace soltrain {

namespace {

// The YAML between the card's first two "---" lines; "" without one.
std::string front_matter(const std::string& readme) {
  std::string s = readme;
  if (s.rfind("\xEF\xBB\xBF", 0) == 0) s.erase(0, 3);  // a byte-order mark
  if (s.rfind("---", 0) != 0) return "";
  const size_t start = s.find('\n');
  if (start == std::string::npos) return "";
  for (size_t at = start + 1; at < s.size();) {
    size_t end = s.find('\n', at);
    if (end == std::string::npos) end = s.size();
    std::string line = s.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "---") return s.substr(start + 1, at - start - 1);
    at = end + 1;
  }
  return "";
}

std::vector<std::string> strings(const YAML::Node& n, const std::string& where) {
  std::vector<std::string> out;
  if (n.IsScalar()) return {n.Scalar()};
  if (!n.IsSequence()) user_error(where, ": a config's data_files path is not a path or a list of them");
  for (const YAML::Node& x : n) {
    if (!x.IsScalar()) user_error(where, ": a config's data_files path is not a path or a list of them");
    out.push_back(x.Scalar());
  }
  return out;
}

// split -> patterns, as datasets' MetadataConfigs reads a config's data_files
std::map<std::string, std::vector<std::string>> splits_of(const YAML::Node& files, const std::string& where) {
  std::map<std::string, std::vector<std::string>> out;
  if (files.IsScalar()) return {{"train", {files.Scalar()}}};
  if (files.IsMap()) {
    for (const auto& kv : files) out[kv.first.Scalar()] = strings(kv.second, where);
    return out;
  }
  if (!files.IsSequence()) user_error(where, ": a config's data_files is not a path, a list or splits");
  for (const YAML::Node& x : files) {
    if (x.IsScalar()) {
      out["train"].push_back(x.Scalar());
    } else if (x.IsMap() && x["split"] && x["path"]) {
      for (const std::string& p : strings(x["path"], where)) out[x["split"].as<std::string>()].push_back(p);
    } else {
      user_error(where, ": a config's data_files entry has no split and path");
    }
  }
  return out;
}

}  // namespace

std::optional<std::vector<std::string>> card_data_files(const std::string& readme, const std::string& name,
                                                        const std::string& split, const std::string& where) {
  const std::string header = front_matter(readme);
  if (header.empty()) return std::nullopt;
  YAML::Node card;
  try {
    card = YAML::Load(header);
  } catch (const YAML::Exception& e) {
    user_error(where, ": the dataset card's YAML header does not parse (", e.what(), ")");
  }
  if (!card.IsMap() || !card["configs"] || !card["configs"].IsSequence() || card["configs"].size() == 0)
    return std::nullopt;
  std::vector<std::string> names;
  std::vector<YAML::Node> configs;
  int chosen = -1, fallback = -1;
  for (const YAML::Node& cfg : card["configs"]) {
    if (!cfg.IsMap() || !cfg["config_name"] || !cfg["data_files"]) continue;
    const std::string n = cfg["config_name"].as<std::string>();
    const int at = int(configs.size());
    names.push_back(n);
    configs.push_back(cfg);
    if (!name.empty() ? n == name : cfg["default"] && cfg["default"].as<std::string>() == "true") chosen = at;
    if (name.empty() && n == "default") fallback = at;
  }
  if (names.empty()) return std::nullopt;
  std::string listed;
  for (const std::string& n : names) listed += (listed.empty() ? "" : ", ") + n;
  if (chosen < 0 && name.empty()) chosen = fallback >= 0 ? fallback : names.size() == 1 ? 0 : -1;
  if (chosen < 0 && !name.empty())
    user_error(where, ": name: \"", name, "\": the dataset card has no such config (it has ", listed, ")");
  if (chosen < 0)
    user_error(where, ": the dataset has several configs (", listed,
               ") and none is the default: choose one with the dataset's name: (Axolotl's key)");
  const auto splits = splits_of(configs[size_t(chosen)]["data_files"], where);
  const auto it = splits.find(split);
  if (it == splits.end()) {
    std::string have;
    for (const auto& [s, p] : splits) have += (have.empty() ? "" : ", ") + s;
    user_error(where, ": config \"", names[size_t(chosen)], "\" has no split \"", split, "\" (it has ", have, ")");
  }
  return it->second;
}

}  // namespace soltrain
