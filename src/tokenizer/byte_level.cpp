// The byte ↔ code point table of GPT-2 (bytes_to_unicode in its encoder.py), built once.
#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace soltrain {

namespace {

struct Table {
  std::array<std::string, 256> to_char;
  std::array<int, 512> to_byte;  // every stand-in is below U+0144
  Table() {
    to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? char32_t(b) : char32_t(256 + extra++);
      utf8_append(to_char[b], cp);
      to_byte[cp] = b;
    }
  }
};

const Table& table() {
  static const Table t;
  return t;
}

}  // namespace

const std::string& byte_level_char(unsigned char b) {
  return table().to_char[b];
}

std::string byte_level_encode(std::string_view s) {
  const Table& t = table();
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char b : s) out += t.to_char[b];
  return out;
}

int byte_level_byte(char32_t cp) {
  return cp < 512 ? table().to_byte[cp] : -1;
}

}  // namespace soltrain
