// Samples → token ids and loss masks. Conversations are rendered with the model's chat template and
// the trained spans (assistant turns) are found from the rendered text itself, not guessed per model.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "data/dataset.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {

// One training document: ids and, per id, 1 if the model is trained to predict it (a token classifier's document:
// 0, or the token's own label + 1; ShardSet::token_labels).
struct Document {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
};

// A character range [begin, end) of the rendered text.
struct TextSpan {
  size_t begin = 0, end = 0;
};

// Mask algorithm (works for any template, checked on Qwen3 and Llama 3):
//  1. F = render(messages). For each assistant message i, its span starts where
//     render(messages[:i], add_generation_prompt=true) stops agreeing with F (the generation prompt is
//     prompt; a partial agreement is cut back to a line break), and ends just after the end-of-turn
//     token that follows in F. The end-of-turn token is read from the turn as the template renders it
//     (render(messages[:i+1]) minus the prompt): the eos token if it occurs there, else its first special
//     token. Diffing whole prefixes is not enough: templates render a turn differently when it is the
//     last one (Qwen3's <think> block) or always append a generation prompt (the original Llama 3).
//  2. The text is cut at span edges and each piece tokenized alone; the concatenated ids must equal
//     tokenize(F) (the tokenizer has no offsets; edges sit next to special tokens or line breaks,
//     where BPE does not merge across), else the record is bad.
//  3. Text after the end-of-turn token (Qwen's "\n" after <|im_end|>) is not trained; the end-of-turn
//     token is (HF / axolotl behaviour).
// Other roles (Axolotl's roles_to_train: [user, assistant], ...) are found as Axolotl's find_turn does:
// the turn rendered with its content and with a dummy content differ exactly in the content. Axolotl's
// train_on_eos decides which end-of-turn tokens are trained: after trained turns (turn, the default),
// after every turn (all), none, or only the last one (last).
class SampleEncoder {
 public:
  // `tmpl` may be null when only text samples are encoded; `eos` (tokenizer_config eos_token) is
  // appended to text documents and marks the end of assistant turns.
  SampleEncoder(Tokenizer& tok, const ChatTemplate* tmpl, std::string eos, bool train_on_inputs);
  // Which turns and end-of-turn tokens are trained (DatasetFields::roles_to_train / train_on_eos).
  void set_turn_training(std::vector<std::string> roles, std::string train_on_eos);
  // tokenizer_config's bos_token ("" when it has none): a response that starts with it loses it (below).
  void set_bos(const std::string& bos);
  // What follows each step of a stepwise_supervised sample (DatasetFields::step_separator).
  void set_step_separator(std::string separator) { step_separator_ = std::move(separator); }

  // BadRecord when the template rejects the conversation or the pieces do not tokenize like the whole.
  Document encode(const Sample& s);

  // The trained spans of a conversation in its rendered text (step 1 above), in order.
  std::vector<TextSpan> trained_spans(const nlohmann::ordered_json& vars, const std::string& full);

 private:
  // A turn's content [begin, end) and its end-of-turn token [eot_begin, eot_end) (eot_begin == npos: none).
  struct Turn {
    size_t begin = 0, end = 0, eot_begin = std::string::npos, eot_end = std::string::npos;
  };
  Turn assistant_turn(const nlohmann::ordered_json& vars, const std::string& full, size_t i);
  Turn other_turn(const nlohmann::ordered_json& vars, const std::string& full, size_t i);
  std::string end_of_turn(const std::string& turn) const;
  std::string render(const nlohmann::ordered_json& vars, size_t n_messages, bool generation_prompt) const;
  bool is_special(int32_t id) const { return special_.count(id) != 0; }

  Tokenizer& tok_;
  const ChatTemplate* tmpl_;
  std::string eos_;
  std::vector<int32_t> eos_ids_;
  std::optional<int32_t> bos_id_;
  bool train_on_inputs_;
  std::vector<std::string> roles_ = {"assistant"};
  std::string train_on_eos_ = "turn";
  std::string step_separator_ = "\n";
  std::unordered_set<int32_t> special_;
};

// tokenizer_config.json's special token `key` (eos_token, bos_token, pad_token: a string or {"content": ...}), ""
// when absent or null.
std::string read_special_token(const std::filesystem::path& tokenizer_config, const char* key);
// tokenizer_config.json's eos_token; UserError if absent.
std::string read_eos_token(const std::filesystem::path& tokenizer_config);
// tokenizer_config.json's bos_token, "" when absent or null (Qwen's).
std::string read_bos_token(const std::filesystem::path& tokenizer_config);

}  // namespace soltrain
