// tokenizer.json "decoder": turns the token strings of ids back into text.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace soltrain {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token list (HF's decode_chain); the text is the concatenation of the result.
  virtual void decode(std::vector<std::string>& tokens) const = 0;
};

// null JSON gives nullptr (tokens are joined with spaces). Unsupported types throw UserError.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where);

}  // namespace soltrain
