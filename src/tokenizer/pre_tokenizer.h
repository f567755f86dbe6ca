// tokenizer.json "pre_tokenizer": splits normalized text into the words BPE encodes one by one.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace soltrain {

// One word being pre-tokenized. at_start: it begins at offset 0 of the original input (Metaspace's
// prepend_scheme "first" only prepends there).
struct Piece {
  std::string text;
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their split (and possibly rewritten) parts; empty parts are dropped.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

// null JSON gives nullptr (each piece is one word). Unsupported types throw UserError.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where);

}  // namespace soltrain
