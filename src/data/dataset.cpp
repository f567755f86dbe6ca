// Record → Sample conversion for the text, instruction and conversation formats.
#include "data/dataset.h"

#include <sstream>

#include "io/json_file.h"

namespace soltrain {

using nlohmann::ordered_json;

std::optional<DatasetType> find_dataset_type(std::string_view s) {
  // Our names, then the ones Axolotl and other trainers' configs use for the same formats.
  static const std::map<std::string_view, DatasetType> names = {{"auto", DatasetType::kAuto},
                                                                {"text", DatasetType::kText},
                                                                {"completion", DatasetType::kText},
                                                                {"instruction", DatasetType::kInstruction},
                                                                {"alpaca", DatasetType::kAlpaca},
                                                                {"conversation", DatasetType::kConversation},
                                                                {"chat", DatasetType::kConversation},
                                                                {"chat_template", DatasetType::kConversation},
                                                                {"sharegpt", DatasetType::kConversation}};
  const auto it = names.find(s);
  if (it == names.end()) return std::nullopt;
  return it->second;
}

DatasetType parse_dataset_type(const std::string& s) {
  if (const auto t = find_dataset_type(s)) return *t;
  user_error("dataset type \"", s, "\": expected auto, text, instruction, alpaca or conversation");
}

std::string to_string(DatasetType t) {
  switch (t) {
    case DatasetType::kAuto: return "auto";
    case DatasetType::kText: return "text";
    case DatasetType::kInstruction: return "instruction";
    case DatasetType::kConversation: return "conversation";
    case DatasetType::kAlpaca: return "alpaca";
  }
  return "?";
}

BadRecordPolicy parse_bad_record_policy(const std::string& s) {
  if (s == "skip") return BadRecordPolicy::kSkip;
  if (s == "error") return BadRecordPolicy::kError;
  user_error("bad-records policy \"", s, "\": expected skip or error");
}

namespace {

[[noreturn]] void bad(const std::string& why) {
  throw BadRecord(why);
}

const std::string& string_field(const ordered_json& r, const std::string& key, bool* present = nullptr) {
  static const std::string empty;
  auto it = r.find(key);
  if (it == r.end() || it->is_null()) {
    if (present) {
      *present = false;
      return empty;
    }
    bad(cat("missing field \"", key, "\""));
  }
  if (!it->is_string()) bad(cat("field \"", key, "\" is ", it->type_name(), ", expected a string"));
  if (present) *present = true;
  return it->get_ref<const std::string&>();
}

std::string map_role(const std::string& role, const DatasetFields& f) {
  auto it = f.roles.find(role);
  if (it == f.roles.end()) bad(cat("unknown role \"", role, "\""));
  return it->second;
}

ordered_json user_assistant(std::string user, const std::string& assistant) {
  ordered_json m = ordered_json::array();
  m.push_back({{"role", "user"}, {"content", std::move(user)}});
  m.push_back({{"role", "assistant"}, {"content", assistant}});
  return m;
}

// OpenAI-style messages: every key is kept (tool_calls, reasoning_content, name, ...) for the template.
ordered_json openai_messages(const ordered_json& list, const DatasetFields& f) {
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < list.size(); ++i) {
    const ordered_json& m = list[i];
    if (!m.is_object()) bad(cat("message ", i, " is ", m.type_name(), ", expected an object"));
    ordered_json msg = ordered_json::object();
    try {
      msg["role"] = map_role(string_field(m, f.role), f);
      bool has_content = false;
      const std::string& content = string_field(m, f.content, &has_content);
      // An assistant turn that only calls tools may have no content.
      if (!has_content && !m.contains("tool_calls")) bad(cat("missing field \"", f.content, "\""));
      msg["content"] = content;
    } catch (const BadRecord& e) {
      bad(cat("message ", i, ": ", e.what()));
    }
    for (const auto& [k, v] : m.items())
      if (k != f.role && k != f.content) msg[k] = v;
    out.push_back(std::move(msg));
  }
  return out;
}

ordered_json sharegpt_messages(const ordered_json& list, const DatasetFields& f) {
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < list.size(); ++i) {
    const ordered_json& m = list[i];
    if (!m.is_object()) bad(cat("message ", i, " is ", m.type_name(), ", expected an object"));
    try {
      out.push_back({{"role", map_role(string_field(m, f.from), f)}, {"content", string_field(m, f.value)}});
    } catch (const BadRecord& e) {
      bad(cat("message ", i, ": ", e.what()));
    }
  }
  return out;
}

}  // namespace

DatasetType detect_type(const ordered_json& r, const DatasetFields& f) {
  if (!r.is_object()) bad(cat("record is ", r.type_name(), ", expected an object"));
  if (r.contains(f.messages) || r.contains(f.conversations)) return DatasetType::kConversation;
  if (r.contains(f.instruction) && r.contains(f.output)) return DatasetType::kInstruction;
  if (r.contains(f.text)) return DatasetType::kText;
  bad(cat("cannot detect the dataset type: the first record has none of \"", f.text, "\", \"", f.instruction, "\"+\"",
          f.output, "\", \"", f.messages, "\", \"", f.conversations,
          "\" (give the dataset's type: `type:` in a config, FILE:TYPE with --data)"));
}

std::string alpaca_prompt(const std::string& instruction, const std::string& input) {
  // Axolotl's AlpacaPrompter (prompt_style "instruct"), character for character: a model fine-tuned by
  // Axolotl on `type: alpaca` expects exactly this at inference.
  if (input.empty())
    return "Below is an instruction that describes a task. Write a response that appropriately completes the "
           "request.\n\n### Instruction:\n" +
           instruction + "\n\n### Response:\n";
  return "Below is an instruction that describes a task, paired with an input that provides further context. "
         "Write a response that appropriately completes the request.\n\n### Instruction:\n" +
         instruction + "\n\n### Input:\n" + input + "\n\n### Response:\n";
}

Sample to_sample(const ordered_json& r, DatasetType type, const DatasetFields& f) {
  if (!r.is_object()) bad(cat("record is ", r.type_name(), ", expected an object"));
  Sample s;
  switch (type) {
    case DatasetType::kAuto: SOLTRAIN_CHECK(false, "to_sample needs a resolved type");
    case DatasetType::kText:
      s.is_text = true;
      s.text = string_field(r, f.text);
      return s;
    case DatasetType::kInstruction: {
      std::string user = string_field(r, f.instruction);
      bool has_input = false;
      const std::string& input = string_field(r, f.input, &has_input);
      if (!input.empty()) user += "\n\n" + input;
      s.vars["messages"] = user_assistant(std::move(user), string_field(r, f.output));
      break;
    }
    case DatasetType::kAlpaca: {
      bool has_input = false;  // the input field is optional: missing or empty is the no-input prompt
      const std::string prompt = alpaca_prompt(string_field(r, f.instruction), string_field(r, f.input, &has_input));
      s.is_text = true;
      s.text = prompt + string_field(r, f.output);
      s.prompt_chars = prompt.size();
      return s;
    }
    case DatasetType::kConversation: {
      const bool openai = r.contains(f.messages);
      const std::string& key = openai ? f.messages : f.conversations;
      auto it = r.find(key);
      if (it == r.end()) bad(cat("missing field \"", f.messages, "\" or \"", f.conversations, "\""));
      if (!it->is_array()) bad(cat("field \"", key, "\" is ", it->type_name(), ", expected an array"));
      if (it->empty()) bad(cat("field \"", key, "\" is an empty conversation"));
      s.vars["messages"] = openai ? openai_messages(*it, f) : sharegpt_messages(*it, f);
      // Other keys (tools, documents, ...) are template variables, as HF's apply_chat_template takes them.
      for (const auto& [k, v] : r.items())
        if (k != f.messages && k != f.conversations) s.vars[k] = v;
      break;
    }
  }
  ordered_json& messages = s.vars["messages"];
  if (!f.system_prompt.empty() && messages[0]["role"] != "system")
    messages.insert(messages.begin(), ordered_json{{"role", "system"}, {"content", f.system_prompt}});
  return s;
}

RecordReader::RecordReader(const std::filesystem::path& path) : path_(path) {
  if (!std::filesystem::is_regular_file(path)) user_error(path.string(), ": dataset file not found");
  in_.open(path, std::ios::binary);
  if (!in_) user_error(path.string(), ": cannot open (unreadable)");
  if (path.extension() == ".json") {
    // A JSON array is parsed whole: a syntax error anywhere makes every element unusable.
    std::stringstream s;
    s << in_.rdbuf();
    elements_ = parse_json_text<ordered_json>(s.str(), path.string());
    if (!elements_.is_array()) user_error(path.string(), ": expected a JSON array of records (or use .jsonl)");
    array_ = true;
  }
}

bool RecordReader::next(ordered_json& record, std::string& where, std::string& error) {
  error.clear();
  if (array_) {
    if (index_ >= elements_.size()) return false;
    where = cat(path_.string(), ": element ", index_);
    record = std::move(elements_[index_++]);
    return true;
  }
  std::string line;
  while (std::getline(in_, line)) {
    ++line_;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    where = cat(path_.string(), ":", line_);
    try {
      record = parse_json_text<ordered_json>(line, "record");
    } catch (const UserError& e) {
      record = nullptr;
      error = std::string(e.what()).substr(std::string("record: ").size());  // "not valid JSON (...)"
    }
    return true;
  }
  return false;
}

}  // namespace soltrain
