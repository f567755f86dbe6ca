// Dataset records from local .jsonl / .json files, turned into samples: plain text, or a conversation
// (messages plus template variables) for the chat template. Formats: text, instruction (alpaca),
// conversation (OpenAI `messages` or ShareGPT `conversations`), alpaca (Axolotl's `### Instruction:` prompt
// as plain text), auto (detected from the first record).
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"

namespace soltrain {

enum class DatasetType { kAuto, kText, kInstruction, kConversation, kAlpaca };
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
  std::string messages = "messages", conversations = "conversations";
  std::string role = "role", content = "content";  // OpenAI style
  std::string from = "from", value = "value";      // ShareGPT style
  // Role names as they appear in the data → the template's roles; applied to both styles.
  std::map<std::string, std::string> roles = {
      {"human", "user"}, {"gpt", "assistant"},       {"system", "system"},      {"tool", "tool"},
      {"user", "user"},  {"assistant", "assistant"}, {"function_call", "tool"}, {"observation", "tool"}};
  std::string system_prompt;  // prepended as a system message when non-empty and the sample has none
};

struct DatasetSource {
  std::filesystem::path path;
  DatasetType type = DatasetType::kAuto;
};

// A usable record. For conversations `vars` holds "messages" and any other template variables the
// record carries (e.g. "tools"), in the record's key order.
struct Sample {
  bool is_text = false;
  std::string text;
  size_t prompt_chars = 0;  // text samples: the first prompt_chars of `text` are prompt (not trained)
  nlohmann::ordered_json vars;
};

// A record that cannot be used; `what()` is the reason, without the location (the reader adds it).
struct BadRecord : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The type the first record looks like (BadRecord if it matches none).
DatasetType detect_type(const nlohmann::ordered_json& record, const DatasetFields& f);
// Axolotl's alpaca prompt for an instruction and an optional input (empty: the no-input form).
std::string alpaca_prompt(const std::string& instruction, const std::string& input);
// Converts one record of a known type (not kAuto); BadRecord on a missing field, wrong type, empty
// conversation or unknown role.
Sample to_sample(const nlohmann::ordered_json& record, DatasetType type, const DatasetFields& f);

// Reads the records of a .jsonl file (one object per non-empty line) or a .json file (one array of
// objects); `where` is "file:line" (JSON lines) or "file: element N" (JSON array).
class RecordReader {
 public:
  explicit RecordReader(const std::filesystem::path& path);  // UserError if missing or unreadable
  // The next record: true and `where` set; `record` is null when the line is not valid JSON, with
  // `error` saying why. False at the end.
  bool next(nlohmann::ordered_json& record, std::string& where, std::string& error);

 private:
  std::filesystem::path path_;
  std::ifstream in_;
  bool array_ = false;
  nlohmann::ordered_json elements_;
  size_t index_ = 0, line_ = 0;
};

}  // namespace soltrain
