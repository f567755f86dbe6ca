#include "data/prompt_codec.h"

#include "core/error.h"
#include "io/json_file.h"
#include "model/generation.h"
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

namespace {
Tokenizer load_tokenizer(const fs::path& dir) {
  if (!fs::is_directory(dir)) user_error(dir.string(), ": no such model folder");
  if (!fs::exists(dir / "tokenizer.json")) user_error(dir.string(), ": no tokenizer.json (the model's tokenizer)");
  return Tokenizer::load(dir / "tokenizer.json");
}
}  // namespace

PromptCodec::PromptCodec(const fs::path& model_dir)
    : dir_(model_dir), tok_(load_tokenizer(model_dir)), eos_(model_eos_ids(model_dir, tok_)) {
  try {
    tmpl_.emplace(ChatTemplate::from_tokenizer_config(dir_ / "tokenizer_config.json"));
  } catch (const UserError&) {  // a model without a template still completes plain prompts
  }
}

std::vector<int32_t> PromptCodec::chat_prompt(const nlohmann::ordered_json& messages, bool enable_thinking) const {
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

std::vector<int32_t> PromptCodec::encode(const std::string& text) const {
  if (!utf8_valid(text)) user_error("the prompt is not valid UTF-8");
  return const_cast<Tokenizer&>(tok_).encode(text);
}

std::vector<int32_t> PromptCodec::prompt(const nlohmann::ordered_json& p, const std::string& where) const {
  if (p.is_string()) {
    if (p.get<std::string>().empty()) user_error(where, ": the prompt is empty");
    return encode(p.get<std::string>());
  }
  if (p.is_array()) {
    if (p.empty()) user_error(where, ": the prompt is an empty conversation");
    try {
      return chat_prompt(p);
    } catch (const UserError& e) {
      user_error(where, ": ", e.what());
    }
  }
  user_error(where, ": prompt must be text or a list of {role, content} messages, not ", p.type_name());
}

std::string PromptCodec::text(std::span<const int32_t> ids) const {
  std::vector<int32_t> known;
  for (int32_t id : ids)
    if (id >= 0 && size_t(id) < tok_.vocab_size()) known.push_back(id);  // padded vocab rows have no text
  return tok_.decode(known, /*skip_special_tokens=*/true);
}

}  // namespace soltrain
