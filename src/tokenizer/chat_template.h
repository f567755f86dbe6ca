// A model's chat template (tokenizer_config.json "chat_template"), rendered as transformers'
// apply_chat_template(tokenize=False) renders it, with the same globals (raise_exception, strftime_now).
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/jinja_template.h"

namespace soltrain {

class ChatTemplate {
 public:
  // Parses the template; a syntax error is a UserError "chat template line L, column C: why".
  explicit ChatTemplate(const std::string& source);

  // Reads "chat_template" (a string, or a list of {name, template} from which `name` is picked) and the
  // bos/eos tokens (strings or {"content": ...}) from a tokenizer_config.json. When the config has no
  // template, a chat_template.jinja next to it is used (where newer transformers save it).
  static ChatTemplate from_tokenizer_config(const std::filesystem::path& path, const std::string& name = "default");

  // Renders with `variables` (messages, tools, add_generation_prompt, enable_thinking, ...). As in HF,
  // bos_token/eos_token default to the tokenizer's, and tools, documents (none) and add_generation_prompt
  // (false) are always defined. raise_exception(msg) gives UserError "chat template: msg".
  // nlohmann::json sorts object keys, which `tojson` then shows in that order; pass ordered_json to keep
  // the order of the input (as Python dicts do).
  std::string render(const nlohmann::json& variables) const;
  std::string render(const nlohmann::ordered_json& variables) const;

  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  void set_special_tokens(std::string bos, std::string eos);

 private:
  jinja::Template template_;
  std::string bos_token_, eos_token_;
  bool has_bos_ = false, has_eos_ = false;

  std::string render_values(jinja::Dict variables) const;
};

}  // namespace soltrain
