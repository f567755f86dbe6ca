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

#include "data/prompt_codec.h"
#include "kernels/ops.h"
#include "model/generation.h"
#include "model/transformer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {

// How many leading bytes of `s` can be shown now: a byte-level token may end inside a character that the next
// token completes, so a truncated UTF-8 sequence and trailing U+FFFD (its lossy decoding) wait.
size_t printable_prefix(const std::string& s);

class ChatModel {
 public:
  // `model_dir` a local folder (hub ids resolved by the caller); `adapter` empty for none.
  ChatModel(const std::filesystem::path& model_dir, const std::string& adapter, const std::string& device);

  // The prompt's ids: `messages` ([{role, content}, ...]) through the model's chat template with the
  // generation prompt; UserError when the model has no template or a message is malformed.
  std::vector<int32_t> chat_prompt(const nlohmann::ordered_json& messages, bool enable_thinking = true) const {
    return codec_.chat_prompt(messages, enable_thinking);
  }
  std::vector<int32_t> encode(const std::string& text) const { return codec_.encode(text); }  // no special tokens
  std::string text(std::span<const int32_t> ids) const { return codec_.text(ids); }           // special tokens skipped
  // `n` continuations of `prompt` (n > 1 decoded as one batch); options' eos_ids default to the model's.
  std::vector<std::vector<int32_t>> complete(const std::vector<int32_t>& prompt, int n, GenerationOptions opts);
  // One continuation of each prompt, generated together as one batch (prompt i's row samples with seed + i);
  // max_new_tokens is capped by the longest prompt's room.
  std::vector<std::vector<int32_t>> complete_each(const std::vector<std::vector<int32_t>>& prompts,
                                                  GenerationOptions opts);
  // Tokens the prompt leaves for an answer in the model's context.
  int room(size_t prompt_tokens) const;
  const std::vector<int32_t>& eos() const { return codec_.eos(); }
  const Tokenizer& tokenizer() const { return codec_.tokenizer(); }

 private:
  PromptCodec codec_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<Transformer> model_;
};

}  // namespace soltrain
