// Reading JSON files with errors that name the file and the position.
#pragma once
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace soltrain {

// Deeper JSON than this is refused while parsing: nlohmann's copies, dumps and our conversions of a value
// recurse, so a record nested 10^5 deep would overflow the stack later. Real files nest a few levels.
inline constexpr int kMaxJsonDepth = 512;

// The deepest nesting of arrays and objects in `text` (brackets inside strings not counted), read in one pass.
// (Checked before parsing, not by a parser callback: nlohmann's callback parser rescans an array's elements each
// time one of its objects ends, which took 12 s for the 150,000 vocabulary entries of a tekken.json.)
inline int json_nesting_depth(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// Parses `text`; UserError "<where>: not valid JSON (...)" for a syntax error, a number out of range or
// nesting past kMaxJsonDepth.
template <typename Json = nlohmann::json>
Json parse_json_text(const std::string& text, const std::string& where) {
  if (json_nesting_depth(text) > kMaxJsonDepth)
    user_error(where, ": not valid JSON (nested more than ", kMaxJsonDepth, " levels deep)");
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    user_error(where, ": not valid JSON (", e.what(), ")");
  }
}

nlohmann::json read_json_file(const std::filesystem::path& path);

}  // namespace soltrain
