// Dataset records (read by record_reader.h), turned into samples: plain text, or a conversation (messages
// plus template variables) for the chat template. Types: text, instruction (Surogate's user/assistant
// turns), conversation (OpenAI `messages` or ShareGPT `conversations`), alpaca and alpaca_chat (Axolotl's
// prompts as plain text), input_output (Axolotl's labelled segments), stepwise_supervised (a process reward model's
// rows: prompt, completions steps, a label per step), auto (detected from the first record).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "data/llama_factory.h"

namespace soltrain {

enum class DatasetType {
  kAuto,
  kText,
  kInstruction,
  kConversation,
  kAlpaca,
  kAlpacaChat,
  kInputOutput,
  kStepwiseSupervised,
  kLlamaFactory,  // a LLaMA-Factory dataset (DatasetFields::llama_factory says its shape)
  kUserDefined    // Axolotl's `type:` given as a mapping (DatasetFields::user_defined)
};

// Axolotl's user-defined prompt (prompt_strategies/user_defined.py): `type: {field_instruction: ..., format: ...}`.
// The prompt is system_format (when the record or system_prompt gives a system text) then format (or no_input_format
// when the input is empty), Python str.format placeholders {system}, {instruction}, {input}; the output follows,
// trained, as alpaca's (InstructionWSystemPromptTokenizingStrategy).
struct UserDefinedFormat {
  std::string system_prompt, format = "{instruction} {input} ", no_input_format = "{instruction} ",
                             system_format = "{system}";
};
// Python's str.format with only these names ({{ and }} escape a brace); UserError naming `where` for another
// placeholder or an unbalanced brace.
std::string format_placeholders(const std::string& format, const std::map<std::string, std::string>& values,
                                const std::string& where);
// Our type names and their aliases ("alpaca", "sharegpt", "chat_template", ...); nullopt for others.
std::optional<DatasetType> find_dataset_type(std::string_view s);
DatasetType parse_dataset_type(const std::string& s);  // find_dataset_type, or a UserError
std::string to_string(DatasetType t);

// What to do with a record that cannot be used: skip it (counted, reported at the end) or stop.
enum class BadRecordPolicy { kSkip, kError };
BadRecordPolicy parse_bad_record_policy(const std::string& s);

// Field names and role mapping; the defaults are the common conventions.
struct DatasetFields {
  std::string text = "text";
  std::string instruction = "instruction", input = "input", output = "output";
  std::string output_prefix;  // alpaca: put before the response (Axolotl's jeopardy: "what is " + answer)
  std::string messages = "messages", conversations = "conversations";
  // Surogate's completion_field: a message (or list of them) appended to the conversation's messages.
  std::string completion;
  std::string role = "role", content = "content";  // OpenAI style
  std::string from = "from", value = "value";      // ShareGPT style
  // Role names as they appear in the data → the template's roles; applied to both styles.
  std::map<std::string, std::string> roles = {
      {"human", "user"}, {"gpt", "assistant"},       {"system", "system"},      {"tool", "tool"},
      {"user", "user"},  {"assistant", "assistant"}, {"function_call", "tool"}, {"observation", "tool"}};
  std::string system_prompt;  // prepended as a system message when non-empty and the sample has none
  // A record field holding the system message (Axolotl `field_system`, Surogate `system_prompt_field` /
  // `system_field`); when set and non-empty in a record it replaces system_prompt for that record.
  std::string system;
  std::string segments = "segments";  // input_output: a list of {label: bool, text: string}
  // Preference pairs (data/preference.h): Axolotl's field_prompt / field_chosen / field_rejected.
  std::string prompt = "prompt", chosen = "chosen", rejected = "rejected";
  // stepwise_supervised (TRL's PRM rows; `prompt` as above): the steps, one label per step, and the text that
  // follows each step (TRL's step_separator; Axolotl's is "\n").
  std::string completions = "completions", labels = "labels", step_separator = "\n";
  bool last_step_label_only = false;  // TRL's train_on_last_step_only: the other steps carry no label
  // Which turns the loss covers (Axolotl chat_template `roles_to_train`, `train_on_eos`: turn | all | none |
  // last); the defaults are Axolotl's and soltrain's own.
  std::vector<std::string> roles_to_train = {"assistant"};
  std::string train_on_eos = "turn";
  // Axolotl's chat_template: "" (not said: the config's top-level choice), "tokenizer_default" (the
  // model's own) or a name from named_templates.h.
  std::string chat_template;
  // chat_template "jinja": the dataset's own Jinja template (Axolotl's dataset-level chat_template_jinja)
  std::string chat_template_jinja;
  bool drop_system_message = false;               // Axolotl's: a conversation's leading system message is left out
  std::optional<UserDefinedFormat> user_defined;  // kUserDefined's formats (its fields are the ones above)
  // A LLaMA-Factory dataset (a translated LLaMA-Factory config's; data/llama_factory.h): its dataset_info.json shape,
  // template and cutoff.
  std::optional<LfFormat> llama_factory;
};

struct DatasetSource {
  DatasetSource(std::filesystem::path p = {}, DatasetType t = DatasetType::kAuto, std::string s = {})
      : path(std::move(p)), type(t), split(std::move(s)) {}
  std::filesystem::path path;  // a file or a folder of files (one dataset)
  DatasetType type = DatasetType::kAuto;
  std::string split;  // a folder's files of this split only (empty: all)
};

// A usable record. For conversations `vars` holds "messages" and any other template variables the
// record carries (e.g. "tools"), in the record's key order.
struct Sample {
  bool is_text = false;
  std::string text;
  // Text samples: the first prompt_chars of `text` are a prompt (tokenized apart from the rest, not trained).
  size_t prompt_chars = 0;
  // input_output: the text is these pieces, each tokenized alone and trained when its label says so.
  std::vector<std::pair<std::string, bool>> segments;
  // stepwise_supervised: `text` is the prompt, followed by these steps; step i's label (0, 1, ...; -1: none) is the
  // target of its last token (the separator's).
  std::vector<std::string> steps;
  std::vector<int> step_labels;
  nlohmann::ordered_json vars;
  // A LLaMA-Factory record with a template (DatasetFields::llama_factory): its converted messages, which
  // data/llama_factory.h renders and cuts as LLaMA-Factory's SupervisedDatasetProcessor does.
  std::optional<LfExample> llama_factory;
};

// A record that cannot be used; `what()` is the reason, without the location (the reader adds it).
struct BadRecord : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `type: auto` (BadRecord if the first record matches nothing), as Surogate's AutoPreprocessor decides from a dataset's
// columns (here the first record's keys): a messages / conversation / conversations list, else instruction + input
// (Alpaca), else a query column (query, prompt, input, instruction, question, problem) and a response column (response,
// answer, output, targets, target, answer_key, answers, solution, text, completion, content), and a system column
// (system, system_prompt). `f` is set to read the columns found. One difference: a record with a "text"
// column and no query stays a text document (Surogate makes it a lone assistant turn of the template).
DatasetType detect_auto(const nlohmann::ordered_json& record, DatasetFields& f);
// Axolotl's alpaca prompt for an instruction and an optional input (empty: the no-input form).
std::string alpaca_prompt(const std::string& instruction, const std::string& input);
// Axolotl's alpaca_chat prompt (AlpacaPrompter, prompt style "chat"): SYSTEM/USER/ASSISTANT lines.
std::string alpaca_chat_prompt(const std::string& instruction, const std::string& input);
// Converts one record of a known type (not kAuto); BadRecord on a missing field, wrong type, empty
// conversation or unknown role.
Sample to_sample(const nlohmann::ordered_json& record, DatasetType type, const DatasetFields& f);

// The fields a dataset of `type` reads from each record (kAuto: those of every type): a parquet file
// decodes only these columns.
std::vector<std::string> needed_fields(DatasetType type, const DatasetFields& f);

}  // namespace soltrain
