// Typed reads of tokenizer.json fields whose mistakes become one UserError line naming the field.
#pragma once
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

#include "core/error.h"

namespace soltrain {

// j[key] as T, or `fallback` when the key is absent or null.
template <typename T>
T json_or(const nlohmann::json& j, const char* key, const T& fallback, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  // (nlohmann casts a float to an integer type unchecked: out of range that is undefined behaviour)
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    if (it->is_number_float()) {
      const double d = it->get<double>();
      if (!(d >= double(std::numeric_limits<T>::min()) && d <= double(std::numeric_limits<T>::max())) ||
          d != std::floor(d))
        user_error(where, ": field '", key, "' is not an integer in range (", it->dump(), ")");
      return T(d);
    }
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    user_error(where, ": field '", key, "' has the wrong type (", it->type_name(), ")");
  }
}

// j[key] as T; a missing key is an error.
template <typename T>
T json_req(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) user_error(where, ": missing field '", key, "'");
  return json_or<T>(j, key, T{}, where);
}

// A {"String": s} or {"Regex": r} pattern as a PCRE2 pattern string.
std::string json_pattern(const nlohmann::json& j, const std::string& where);

}  // namespace soltrain
