// Reading one config value: where it came from (file:line or --set), and typed getters that refuse a bad value
// with one line naming the key, the value and what is expected. Shared by the config's keys, its datasets'
// keys and the schema (cli/config_schema.h).
#pragma once
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"

namespace soltrain {

// A value and where it came from ("file:line" or "--set key=value"), for messages.
struct Entry {
  YAML::Node node;
  std::string where;
};

std::string scalar_text(const YAML::Node& n);
std::string where_of(const std::string& file, const YAML::Node& n);
[[noreturn]] void bad_value(const Entry& e, const std::string& key, const std::string& expected);
// The known name closest to `key` when close enough to be a likely typo, else "".
std::string closest(const std::string& key, const std::vector<std::string>& known);
[[noreturn]] void unknown_key(const std::string& where, const std::string& key, const std::vector<std::string>& known,
                              const std::string& what);

template <typename T>
T get(const Entry& e, const std::string& key, const std::string& expected) {
  if (!e.node.IsScalar()) bad_value(e, key, expected);
  try {
    return e.node.as<T>();
  } catch (const YAML::Exception&) {
    bad_value(e, key, expected);
  }
}

bool get_bool(const Entry& e, const std::string& key);
std::string get_string(const Entry& e, const std::string& key);
// A hub revision (branch, tag, commit or refs/pr/N): a name that stays inside the cache's refs/ folder.
std::string get_revision(const Entry& e, const std::string& key);
int64_t get_int(const Entry& e, const std::string& key, int64_t min, int64_t max = INT64_MAX);
// Keys held in an int: a larger value is refused here, naming the key, rather than wrapping around.
int get_int32(const Entry& e, const std::string& key, int64_t min, int64_t max = INT32_MAX);
double get_double(const Entry& e, const std::string& key, double min, double max, bool open_min = false);
std::vector<std::string> get_string_list(const Entry& e, const std::string& key);

// YAML as the JSON it spells: scalars read as YAML 1.2's core schema reads them (integers, numbers, booleans, null),
// quoted ones and the rest strings (an inline DeepSpeed config, a LLaMA-Factory dataset_info entry).
nlohmann::json yaml_to_json(const YAML::Node& n);

}  // namespace soltrain
