// UTF-8 helpers for the tokenizer: walking code points, validating, and Rust-style lossy decoding.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace soltrain {

// Byte length of the UTF-8 sequence that starts with `lead` (1 for a stray continuation byte).
inline size_t utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i past it.
char32_t utf8_next(std::string_view s, size_t& i);

void utf8_append(std::string& out, char32_t cp);

// True when s is well-formed UTF-8 (no overlongs, surrogates or values above U+10FFFF).
bool utf8_valid(std::string_view s);

// Decodes bytes like Rust's String::from_utf8_lossy, which HF decoders use: every maximal invalid
// subsequence becomes one U+FFFD, so our decoded text matches theirs byte for byte.
std::string utf8_lossy(std::string_view bytes);

// Unicode White_Space, Alphabetic-or-Numeric (Rust's char::is_whitespace / is_alphanumeric).
bool is_unicode_whitespace(char32_t cp);
bool is_unicode_alphanumeric(char32_t cp);

}  // namespace soltrain
