#include "cli/config_values.h"

#include <algorithm>
#include <cctype>

#include "cli/config.h"
#include "hub/hub_cache.h"

namespace soltrain {

std::string scalar_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

[[noreturn]] void bad_value(const Entry& e, const std::string& key, const std::string& expected) {
  user_error(e.where, ": ", key, ": \"", scalar_text(e.node), "\" is not valid: expected ", expected);
}

std::string closest(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& k : known) {
    const size_t d = edit_distance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  // A suggestion further away than half the key is noise, not help.
  return best_d <= std::max<size_t>(2, key.size() / 2) ? best : "";
}

[[noreturn]] void unknown_key(const std::string& where, const std::string& key, const std::vector<std::string>& known,
                              const std::string& what) {
  const std::string s = closest(key, known);
  user_error(where, ": unknown ", what, " \"", key, "\"", s.empty() ? "" : cat(" (did you mean \"", s, "\"?)"));
}

bool get_bool(const Entry& e, const std::string& key) {
  return get<bool>(e, key, "true or false");
}

std::string get_string(const Entry& e, const std::string& key) {
  if (!e.node.IsScalar() || e.node.Scalar().empty()) bad_value(e, key, "a non-empty string");
  return e.node.Scalar();
}

std::string get_revision(const Entry& e, const std::string& key) {
  const std::string v = get_string(e, key);
  if (!is_safe_revision(v))
    bad_value(e, key,
              "a branch, tag or commit name (relative: no empty, \".\" or \"..\" part, no leading \"/\", no control "
              "characters)");
  return v;
}

int64_t get_int(const Entry& e, const std::string& key, int64_t min, int64_t max) {
  const std::string expected =
      max == INT64_MAX ? cat("an integer >= ", min) : cat("an integer from ", min, " to ", max);
  // YAML 1.1's digit groups (500_000), as PyYAML reads them for Axolotl: an unquoted integer with '_' between digits
  if (e.node.IsScalar() && e.node.Tag() != "!" && e.node.Scalar().find('_') != std::string::npos) {
    const std::string s = e.node.Scalar();
    std::string digits;
    bool ok = !s.empty() && s.front() != '_' && s.back() != '_' && s.find("__") == std::string::npos;
    for (size_t i = 0; ok && i < s.size(); ++i)
      if (s[i] != '_') {
        ok = std::isdigit(static_cast<unsigned char>(s[i])) || (i == 0 && (s[i] == '-' || s[i] == '+'));
        digits += s[i];
      }
    if (ok && digits.size() <= 18) {
      const int64_t v = std::stoll(digits);
      if (v < min || v > max) bad_value(e, key, expected);
      return v;
    }
  }
  const int64_t v = get<int64_t>(e, key, expected);
  if (v < min || v > max) bad_value(e, key, expected);
  return v;
}

int get_int32(const Entry& e, const std::string& key, int64_t min, int64_t max) {
  return int(get_int(e, key, min, max));
}

double get_double(const Entry& e, const std::string& key, double min, double max, bool open_min) {
  const std::string expected = cat("a number in ", open_min ? "(" : "[", min, ", ", max, "]");
  const double v = get<double>(e, key, expected);
  if (!(v <= max) || v < min || (open_min && v == min)) bad_value(e, key, expected);
  return v;
}

std::vector<std::string> get_string_list(const Entry& e, const std::string& key) {
  if (e.node.IsScalar()) return {get_string(e, key)};
  if (!e.node.IsSequence()) bad_value(e, key, "a list of strings");
  std::vector<std::string> out;
  for (const YAML::Node& n : e.node) out.push_back(get_string({n, e.where}, key));
  return out;
}

std::string where_of(const std::string& file, const YAML::Node& n) {
  return cat(file, ":", n.Mark().line + 1);
}

// YAML as the JSON it spells: scalars read as YAML 1.2's core schema reads them (integers, numbers, booleans,
// null), the rest strings.
nlohmann::json yaml_to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& kv : n) j[kv.first.Scalar()] = yaml_to_json(kv.second);
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (const YAML::Node& v : n) j.push_back(yaml_to_json(v));
    return j;
  }
  if (!n.IsDefined() || n.IsNull()) return nullptr;
  const std::string s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted in the file: a string
  if (s == "true" || s == "True") return true;
  if (s == "false" || s == "False") return false;
  try {
    size_t used = 0;
    const long long i = std::stoll(s, &used);
    if (used == s.size()) return i;
    const double d = std::stod(s, &used);
    if (used == s.size()) return d;
  } catch (const std::exception&) {
  }
  return s;
}

}  // namespace soltrain
