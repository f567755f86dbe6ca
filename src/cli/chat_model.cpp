#include "cli/chat_model.h"

#include "cli/device_option.h"
#include "core/error.h"
#include "io/json_file.h"
#include "model/checkpoint.h"
#include "model/peft_adapter.h"
#include "tokenizer/utf8.h"

namespace soltrain {

namespace fs = std::filesystem;

std::vector<int32_t> model_eos_ids(const fs::path& model, const Tokenizer& tok) {
  std::vector<int32_t> ids = read_generation_eos(model);
  const auto cfg = model / "tokenizer_config.json";
  if (!ids.empty() || !fs::exists(cfg)) return ids;
  const nlohmann::json j = read_json_file(cfg);
  const auto it = j.find("eos_token");
  if (it == j.end()) return ids;
  const nlohmann::json& e = it->is_object() ? it->value("content", nlohmann::json()) : *it;
  if (e.is_string())
    if (auto id = tok.token_to_id(e.get<std::string>())) ids.push_back(*id);
  return ids;
}

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

namespace {
Tokenizer load_tokenizer(const fs::path& dir) {
  if (!fs::is_directory(dir)) user_error(dir.string(), ": no such model folder");
  if (!fs::exists(dir / "tokenizer.json")) user_error(dir.string(), ": no tokenizer.json (the model's tokenizer)");
  return Tokenizer::load(dir / "tokenizer.json");
}
}  // namespace

ChatModel::ChatModel(const fs::path& model_dir, const std::string& adapter, const std::string& device)
    : dir_(model_dir), tok_(load_tokenizer(model_dir)), eos_(model_eos_ids(model_dir, tok_)), ops_(make_ops(device)) {
  try {
    tmpl_.emplace(ChatTemplate::from_tokenizer_config(dir_ / "tokenizer_config.json"));
  } catch (const UserError&) {  // a model without a template still completes plain prompts
  }
  model_ = adapter.empty() ? load_pretrained(dir_, *ops_, std::nullopt, /*gradients=*/false)
                           : load_pretrained_with_adapter(dir_, adapter, *ops_);
}

std::vector<int32_t> ChatModel::chat_prompt(const nlohmann::ordered_json& messages, bool enable_thinking) const {
  if (!tmpl_) user_error(dir_.string(), ": this tokenizer has no chat template");
  if (!messages.is_array() || messages.empty()) user_error("messages: expected a non-empty list of {role, content}");
  for (const auto& m : messages)
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      user_error("messages: every message needs a role (system, user, assistant) and content");
  nlohmann::ordered_json vars;
  vars["messages"] = messages;
  vars["add_generation_prompt"] = true;
  vars["enable_thinking"] = enable_thinking;
  return encode(tmpl_->render(vars));
}

std::vector<int32_t> ChatModel::encode(const std::string& text) const {
  if (!utf8_valid(text)) user_error("the prompt is not valid UTF-8");
  return const_cast<Tokenizer&>(tok_).encode(text);
}

std::string ChatModel::text(std::span<const int32_t> ids) const {
  std::vector<int32_t> known;
  for (int32_t id : ids)
    if (id >= 0 && size_t(id) < tok_.vocab_size()) known.push_back(id);  // padded vocab rows have no text
  return tok_.decode(known, /*skip_special_tokens=*/true);
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
  if (o.eos_ids.empty()) o.eos_ids = eos_;
  KvDecoder decoder(*model_, n, int(prompt.size()) + o.max_new_tokens, 512);
  if (n == 1) return {generate(decoder, prompt, o)};
  return generate_batch(decoder, prompt, o);
}

}  // namespace soltrain
