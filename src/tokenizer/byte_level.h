// GPT-2's byte-level alphabet: every byte maps to one printable code point, so BPE never sees raw bytes.
#pragma once
#include <array>
#include <string>
#include <string_view>

namespace soltrain {

// UTF-8 of the code point that stands for byte b (printable bytes stand for themselves).
const std::string& byte_level_char(unsigned char b);

// s with each byte replaced by its stand-in character.
std::string byte_level_encode(std::string_view s);

// The byte a stand-in code point means, or -1 if cp is not in the alphabet.
int byte_level_byte(char32_t cp);

}  // namespace soltrain
