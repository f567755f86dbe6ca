// tokenizer.json "normalizer": text rewrites (NFC, Replace, Prepend, ...) applied before pre-tokenization.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace soltrain {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites s (valid UTF-8) in place.
  virtual void normalize(std::string& s) const = 0;
};

// Builds the normalizer a tokenizer.json describes; null JSON gives nullptr (no normalization).
// Unsupported types throw UserError naming `where` and the type.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where);

}  // namespace soltrain
