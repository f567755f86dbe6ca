// Reading JSON files with errors that name the file and the position.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace soltrain {

// Deeper JSON than this is refused while parsing: nlohmann's copies, dumps and our conversions of a value
// recurse, so a record nested 10^5 deep would overflow the stack later. Real files nest a few levels.
inline constexpr int kMaxJsonDepth = 512;

// Parses `text`; UserError "<where>: not valid JSON (...)" for a syntax error, a number out of range or
// nesting past kMaxJsonDepth.
template <typename Json = nlohmann::json>
Json parse_json_text(const std::string& text, const std::string& where) {
  try {
    return Json::parse(text, [](int depth, typename Json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth) throw UserError(cat("nested more than ", kMaxJsonDepth, " levels deep"));
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    user_error(where, ": not valid JSON (", e.what(), ")");
  } catch (const UserError& e) {
    user_error(where, ": not valid JSON (", e.what(), ")");
  }
}

nlohmann::json read_json_file(const std::filesystem::path& path);

}  // namespace soltrain
