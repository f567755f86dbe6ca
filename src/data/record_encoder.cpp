#include "data/record_encoder.h"

#include "data/named_templates.h"

namespace soltrain {

ChatTemplate chat_template_for(const std::string& name, const std::string& jinja,
                               const std::filesystem::path& tokenizer_config) {
  if (name.empty() || name == "tokenizer_default") return ChatTemplate::from_tokenizer_config(tokenizer_config);
  const auto source = name == "jinja" ? std::optional<std::string>(jinja) : named_chat_template(name);
  if (!source) user_error("chat_template: \"", name, "\" is not a template soltrain has");
  ChatTemplate t(*source);
  // (only the tokenizer's bos/eos: a base model's tokenizer_config, with no template of its own, is fine here)
  t.set_special_tokens(read_special_token(tokenizer_config, "bos_token"),
                       read_special_token(tokenizer_config, "eos_token"));
  return t;
}

RecordEncoder::RecordEncoder(Tokenizer& tok, const std::filesystem::path& tokenizer_dir, DatasetType type,
                             DatasetFields fields, bool train_on_inputs)
    : dir_(tokenizer_dir),
      type_(type),
      fields_(std::move(fields)),
      train_on_inputs_(train_on_inputs),
      tok_(tok),
      eos_(read_eos_token(tokenizer_dir / "tokenizer_config.json")),
      bos_(read_bos_token(tokenizer_dir / "tokenizer_config.json")) {}

Document RecordEncoder::encode(const nlohmann::ordered_json& record) {
  if (type_ == DatasetType::kAuto) type_ = detect_auto(record, fields_);
  const Sample s = to_sample(record, type_, fields_);
  // The template is parsed only when a conversation needs it: base models often have none.
  if (!s.is_text && !s.llama_factory && !tmpl_) {
    tmpl_.emplace(
        chat_template_for(fields_.chat_template, fields_.chat_template_jinja, dir_ / "tokenizer_config.json"));
    enc_.reset();
  }
  if (!enc_) {
    enc_.emplace(tok_, tmpl_ ? &*tmpl_ : nullptr, eos_, train_on_inputs_);
    enc_->set_turn_training(fields_.roles_to_train, fields_.train_on_eos);
    enc_->set_bos(bos_);
    enc_->set_step_separator(fields_.step_separator);
  }
  return enc_->encode(s);
}

}  // namespace soltrain
