// A model ready to answer chat messages, one loader for `generate`, `chat`, `inference` and `serve`: the model
// (with a PEFT adapter when given) on its device, its tokenizer, chat template and end-of-sequence ids.
#pragma once
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/generation.h"
#include "model/transformer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {

// generation_config.json's eos_token_id, else tokenizer_config.json's eos_token.
std::vector<int32_t> model_eos_ids(const std::filesystem::path& model_dir, const Tokenizer& tok);

// How many leading bytes of `s` can be shown now: a byte-level token may end inside a character that the next
// token completes, so a truncated UTF-8 sequence and trailing U+FFFD (its lossy decoding) wait.
size_t printable_prefix(const std::string& s);

class ChatModel {
 public:
  // `model_dir` a local folder (hub ids resolved by the caller); `adapter` empty for none.
  ChatModel(const std::filesystem::path& model_dir, const std::string& adapter, const std::string& device);

  // The prompt's ids: `messages` ([{role, content}, ...]) through the model's chat template with the
  // generation prompt; UserError when the model has no template or a message is malformed.
  std::vector<int32_t> chat_prompt(const nlohmann::ordered_json& messages, bool enable_thinking = true) const;
  std::vector<int32_t> encode(const std::string& text) const;  // a plain prompt (no special tokens)
  std::string text(std::span<const int32_t> ids) const;        // special tokens skipped, as generate prints
  // `n` continuations of `prompt` (n > 1 decoded as one batch); options' eos_ids default to the model's.
  std::vector<std::vector<int32_t>> complete(const std::vector<int32_t>& prompt, int n, GenerationOptions opts);
  // Tokens the prompt leaves for an answer in the model's context.
  int room(size_t prompt_tokens) const;
  const std::vector<int32_t>& eos() const { return eos_; }

 private:
  std::filesystem::path dir_;
  Tokenizer tok_;
  std::optional<ChatTemplate> tmpl_;
  std::vector<int32_t> eos_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<Transformer> model_;
};

}  // namespace soltrain
