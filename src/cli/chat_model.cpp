#include "cli/chat_model.h"

#include <algorithm>

#include "cli/device_option.h"
#include "core/error.h"
#include "io/json_file.h"
#include "model/checkpoint.h"
#include "model/peft_adapter.h"
#include "tokenizer/utf8.h"

namespace soltrain {

namespace fs = std::filesystem;

size_t printable_prefix(const std::string& s) {
  size_t end = s.size(), i = end;
  int cont = 0;
  while (i > 0 && cont < 3 && (uint8_t(s[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++cont;
  }
  if (i > 0) {
    const uint8_t lead = uint8_t(s[i - 1]);
    const int need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (need > cont + 1) end = i - 1;
  }
  while (end >= 3 && s.compare(end - 3, 3, "\xEF\xBF\xBD") == 0) end -= 3;
  return end;
}

ChatModel::ChatModel(const fs::path& model_dir, const std::string& adapter, const std::string& device)
    : codec_(model_dir), ops_(make_ops(device)) {
  model_ = adapter.empty() ? load_pretrained(model_dir, *ops_, std::nullopt, /*gradients=*/false)
                           : load_pretrained_with_adapter(model_dir, adapter, *ops_);
}

int ChatModel::room(size_t prompt_tokens) const {
  return int(std::max<int64_t>(0, model_->config().max_position_embeddings - int64_t(prompt_tokens)));
}

std::vector<std::vector<int32_t>> ChatModel::complete(const std::vector<int32_t>& prompt, int n, GenerationOptions o) {
  if (prompt.empty()) user_error("the prompt is empty");
  if (o.max_new_tokens < 1) user_error("max_tokens ", o.max_new_tokens, ": expected >= 1");
  if (o.max_new_tokens > room(prompt.size()))
    user_error("the prompt's ", prompt.size(), " tokens plus ", o.max_new_tokens,
               " new ones exceed the model's context (max_position_embeddings ",
               model_->config().max_position_embeddings, ")");
  o.sampling.validate();
  if (o.eos_ids.empty()) o.eos_ids = codec_.eos();
  KvDecoder decoder(*model_, n, int(prompt.size()) + o.max_new_tokens, 512, o.sampling.repetition_penalty != 1);
  if (n == 1) return {generate(decoder, prompt, o)};
  return generate_batch(decoder, prompt, o);
}

std::vector<std::vector<int32_t>> ChatModel::complete_each(const std::vector<std::vector<int32_t>>& prompts,
                                                           GenerationOptions o) {
  size_t longest = 0;
  for (const auto& p : prompts) {
    if (p.empty()) user_error("the prompt is empty");
    longest = std::max(longest, p.size());
  }
  o.max_new_tokens = std::min(o.max_new_tokens, room(longest));
  if (o.max_new_tokens < 1)
    user_error("a prompt's ", longest, " tokens leave no room in the model's context (max_position_embeddings ",
               model_->config().max_position_embeddings, ")");
  o.sampling.validate();
  if (o.eos_ids.empty()) o.eos_ids = codec_.eos();
  return generate_each(*model_, prompts, o);
}

}  // namespace soltrain
