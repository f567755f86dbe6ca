// LLaMA-Factory's data pipeline, as its src/llamafactory/data does it (v0.9.5): a dataset_info.json entry's shape
// (alpaca or sharegpt formatting, its column and tag names, ranking), the converter that turns a record into prompt
// and response messages, and its own templates (template.py's register_template rows, not the tokenizer's Jinja):
// each message rendered into elements, each element tokenized alone (a text with no special tokens added, or the
// bos / eos token), a conversation's turns paired (prompt, response) and cut to cutoff_len by infer_seqlen
// (data/llama_factory_encode.h turns them into tokens).
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace soltrain {

// One LLaMA-Factory template (template.py register_template): each format is a list of slots, a slot a text with
// "{{content}}" or one of the markers below. Only what the text-only templates use.
struct LfTemplate {
  std::string name;
  std::vector<std::string> user, assistant, system, observation, prefix;
  std::string default_system;
  std::vector<std::string> stop_words;
  bool replace_eos = false;
  bool system_in_first_user = false;  // Llama2Template (llama2, mistral): the system text starts the first user turn
  bool reasoning = false;  // ReasoningTemplate (qwen3): an answer without a thought gets an empty one, trained
};
// Slot markers: the tokenizer's bos / eos token as one id (LF's {"bos_token"} / {"eos_token"} sets).
inline constexpr std::string_view kLfBos = "\x01lf-bos", kLfEos = "\x01lf-eos";

// The template of that name, nullopt for one not built here.
const LfTemplate* find_lf_template(std::string_view name);
// The names built, for messages.
std::string lf_template_names();

// A dataset_info.json entry's shape (data/README.md there): formatting, ranking and the column / tag names.
struct LfFormat {
  bool sharegpt = false, ranking = false;
  // alpaca columns (prompt, query, response, history), sharegpt's messages, and both's system, chosen, rejected,
  // kto_tag; "" = not given
  std::string prompt = "instruction", query = "input", response = "output", history, messages = "conversations", system,
              chosen, rejected, kto_tag;
  std::string role_tag = "from", content_tag = "value", user_tag = "human", assistant_tag = "gpt",
              observation_tag = "observation", function_tag = "function_call", system_tag = "system";
  // the config's: `template` (empty: none named, the tokenizer's chat template renders), cutoff_len, train_on_prompt
  std::string template_name;
  int64_t cutoff_len = 0;
  bool train_on_prompt = false;
};
// `info` is one dataset_info.json entry (with template / cutoff_len / train_on_prompt beside, as the translated
// config's `llama_factory` mapping holds them); UserError (naming `where`) on a value of the wrong kind or a column the
// text-only pipeline cannot read (images, videos, audios, tools).
LfFormat read_lf_format(const nlohmann::json& info, const std::string& where);
// Every field, for the prepared data's cache key.
nlohmann::json lf_format_json(const LfFormat& f);

// One record converted (converter.py): the prompt messages (role user / assistant / observation / function), the
// responses (one; chosen then rejected when ranking; KTO: the answer and an empty one, the order saying the tag),
// and the system text. BadRecord as LLaMA-Factory skips the record (a role out of turn, a wrong message count).
struct LfExample {
  nlohmann::ordered_json prompt = nlohmann::ordered_json::array(), response = nlohmann::ordered_json::array();
  std::string system;
  std::optional<bool> kto_tag;
  // how it is rendered (the format's): the template (null: none named), cutoff_len (0: no cut), train_on_prompt
  const LfTemplate* tmpl = nullptr;
  int64_t cutoff_len = 0;
  bool train_on_prompt = false;
};
LfExample lf_convert(const nlohmann::ordered_json& record, const LfFormat& f);

// The messages rendered by the template (Template._encode): per message, its elements, texts and bos/eos markers.
std::vector<std::vector<std::string>> lf_render(const LfTemplate& t, const nlohmann::ordered_json& messages,
                                                const std::string& system);

// processor_utils.py infer_seqlen: how many source and target tokens survive a cutoff.
std::pair<int64_t, int64_t> lf_infer_seqlen(int64_t source_len, int64_t target_len, int64_t cutoff_len);

}  // namespace soltrain
