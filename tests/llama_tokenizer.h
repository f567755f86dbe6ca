// A small stand-in for Llama 3.1's tokenizer: the demo byte tokenizer plus Llama 3's chat specials
// (<|begin_of_text|> 259, <|start_header_id|> 260, <|end_header_id|> 261, <|eot_id|> 262; bos_token and
// eos_token as Llama 3.1 Instruct has them) and, when asked, its post_processor: a Sequence of ByteLevel and
// a TemplateProcessing that puts <|begin_of_text|> before every encoded text.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "io/json_file.h"
#include "test_util.h"

namespace soltrain::test {

inline constexpr int32_t kLlamaBos = 259, kLlamaEot = 262;

// Rewrites the byte tokenizer in `dir` (write_byte_tokenizer / write_random_model) in place.
inline void add_llama3_specials(const std::filesystem::path& dir, bool bos_post_processor) {
  using nlohmann::json;
  json tok = read_json_file(dir / "tokenizer.json");
  int32_t id = kLlamaBos;
  for (const char* s : {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"})
    tok["added_tokens"].push_back({{"id", id++},
                                   {"content", s},
                                   {"single_word", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"normalized", false},
                                   {"special", true}});
  if (bos_post_processor)
    tok["post_processor"] = json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [259],
                                                "tokens": ["<|begin_of_text|>"]}}}]})");
  write_text(dir / "tokenizer.json", tok.dump(1));
  json cfg = read_json_file(dir / "tokenizer_config.json");
  cfg["bos_token"] = "<|begin_of_text|>";
  cfg["eos_token"] = "<|eot_id|>";
  write_text(dir / "tokenizer_config.json", cfg.dump(1));
}

}  // namespace soltrain::test
