// RFC 4648 base64 (OpenSSL's libcrypto): the hub's commit API carries a file's bytes in it, and Mistral's
// tekken.json its tokens'.
#pragma once
#include <string>
#include <string_view>

namespace soltrain {

std::string base64(std::string_view bytes);
// The bytes of `text`; UserError naming `where` when it is not base64.
std::string base64_decode(std::string_view text, const std::string& where);

}  // namespace soltrain
