// A model folder's text side for generation: its tokenizer, chat template and end-of-sequence ids. Prompts are
// plain text (tokenized as written, no special tokens added) or conversations ([{role, content}, ...], rendered
// by the chat template with the generation prompt), as TRL's trainers and the chat commands take them;
// completions decode with special tokens skipped. One reader for `generate`, `chat`, `serve` and GRPO.
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {

// generation_config.json's eos_token_id, else tokenizer_config.json's eos_token.
std::vector<int32_t> model_eos_ids(const std::filesystem::path& model_dir, const Tokenizer& tok);

class PromptCodec {
 public:
  // A UserError when the folder or its tokenizer.json is missing; a model without a chat template still
  // encodes plain prompts.
  explicit PromptCodec(const std::filesystem::path& model_dir);

  // `messages` through the chat template with the generation prompt; UserError when the model has no template
  // or a message is malformed.
  std::vector<int32_t> chat_prompt(const nlohmann::ordered_json& messages, bool enable_thinking = true) const;
  std::vector<int32_t> encode(const std::string& text) const;  // a plain prompt (no special tokens)
  // A dataset's prompt: a string (plain) or a list of messages (chat); UserError naming `where` otherwise.
  std::vector<int32_t> prompt(const nlohmann::ordered_json& prompt, const std::string& where) const;
  std::string text(std::span<const int32_t> ids) const;  // special tokens skipped
  const std::vector<int32_t>& eos() const { return eos_; }
  bool has_chat_template() const { return tmpl_.has_value(); }
  const Tokenizer& tokenizer() const { return tok_; }

 private:
  std::filesystem::path dir_;
  Tokenizer tok_;
  std::optional<ChatTemplate> tmpl_;
  std::vector<int32_t> eos_;
};

}  // namespace soltrain
