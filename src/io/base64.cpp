#include "io/base64.h"

#include <openssl/evp.h>

#include "core/error.h"

namespace soltrain {

std::string base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), int(bytes.size()));
  out.resize(size_t(n));
  return out;
}

std::string base64_decode(std::string_view text, const std::string& where) {
  if (text.size() % 4 != 0) user_error(where, ": \"", text, "\" is not base64");
  std::string out(text.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()), int(text.size()));
  if (n < 0) user_error(where, ": \"", text, "\" is not base64");
  // (EVP_DecodeBlock counts the padding's bytes as zeros)
  size_t pad = 0;
  while (pad < 2 && pad < text.size() && text[text.size() - 1 - pad] == '=') ++pad;
  out.resize(size_t(n) - pad);
  return out;
}

}  // namespace soltrain
