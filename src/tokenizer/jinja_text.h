// UTF-8 helpers for the template engine: Python strings index, slice and strip by code point.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace soltrain::jinja {

// Code points of a UTF-8 string; an invalid byte becomes one code point of its own value.
std::u32string decode_utf8(std::string_view s);
std::string encode_utf8(std::u32string_view s);
// All of s as an integer in `base`; nullopt when anything is left over, missing or out of int64 range
// (the callers turn that into a template error instead of letting std::stoll throw past them).
std::optional<int64_t> parse_int(std::string_view s, int base = 10);
// Python's str.isspace() for one code point.
bool is_py_space(char32_t c);
// Python's str.strip/lstrip/rstrip: `chars` == nullptr strips whitespace, else the given code points.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);

}  // namespace soltrain::jinja
