// Record → Sample conversion for the text, instruction and conversation formats.
#include "data/dataset.h"

#include <algorithm>
#include <cctype>

#include "io/json_file.h"

namespace soltrain {

using nlohmann::ordered_json;

std::optional<DatasetType> find_dataset_type(std::string_view s) {
  // Our names, then the ones Axolotl and other trainers' configs use for the same formats.
  static const std::map<std::string_view, DatasetType> names = {
      {"auto", DatasetType::kAuto},
      {"text", DatasetType::kText},
      {"completion", DatasetType::kText},
      {"pretrain", DatasetType::kText},  // Axolotl's pretraining_dataset entries
      {"instruction", DatasetType::kInstruction},
      {"alpaca", DatasetType::kAlpaca},
      {"alpaca_chat", DatasetType::kAlpacaChat},
      // Axolotl's base:prompt_style form (AlpacaPrompter)
      {"alpaca:chat", DatasetType::kAlpacaChat},
      {"alpaca:instruct", DatasetType::kAlpaca},
      // Axolotl's jeopardy: AlpacaPrompter over question / category / "what is " + answer (its JeopardyPrompter's
      // own prompt_input is never read; dataset_keys.cpp sets the fields)
      {"jeopardy", DatasetType::kAlpaca},
      {"input_output", DatasetType::kInputOutput},
      {"stepwise_supervised", DatasetType::kStepwiseSupervised},
      {"llama_factory", DatasetType::kLlamaFactory},
      {"conversation", DatasetType::kConversation},
      {"chat", DatasetType::kConversation},
      {"chat_template", DatasetType::kConversation},
      // Axolotl's module.function form of the same loader
      {"chat_template.default", DatasetType::kConversation},
      {"sharegpt", DatasetType::kConversation}};
  const auto it = names.find(s);
  if (it == names.end()) return std::nullopt;
  return it->second;
}

DatasetType parse_dataset_type(const std::string& s) {
  if (const auto t = find_dataset_type(s)) return *t;
  user_error("dataset type \"", s,
             "\": expected auto, text, instruction, alpaca, alpaca_chat, input_output, conversation or "
             "stepwise_supervised");
}

std::string to_string(DatasetType t) {
  switch (t) {
    case DatasetType::kAuto: return "auto";
    case DatasetType::kText: return "text";
    case DatasetType::kInstruction: return "instruction";
    case DatasetType::kConversation: return "conversation";
    case DatasetType::kAlpaca: return "alpaca";
    case DatasetType::kAlpacaChat: return "alpaca_chat";
    case DatasetType::kInputOutput: return "input_output";
    case DatasetType::kStepwiseSupervised: return "stepwise_supervised";
    case DatasetType::kLlamaFactory: return "llama_factory";
    case DatasetType::kUserDefined: return "user_defined";
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
      if (const auto c = m.find(f.content); c != m.end() && c->is_array()) {
        // (a list of content chunks, {"type": "text", "text": ...} / {"type": "thinking", ...}: passed to the
        // template as transformers' apply_chat_template passes it)
        for (const auto& chunk : *c)
          if (!chunk.is_object() || !chunk.contains("type"))
            bad(cat("field \"", f.content, "\" is a list whose items are not {\"type\": ...} chunks"));
        msg["content"] = *c;
      } else {
        bool has_content = false;
        const std::string& content = string_field(m, f.content, &has_content);
        // An assistant turn that only calls tools may have no content.
        if (!has_content && !m.contains("tool_calls")) bad(cat("missing field \"", f.content, "\""));
        msg["content"] = content;
      }
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

namespace {

// The record's key equal to `name` ignoring case (Surogate's safe_rename_columns matches columns so), or ""
// when it has none.
std::string key_like(const ordered_json& r, const std::string& name) {
  for (auto it = r.begin(); it != r.end(); ++it) {
    const std::string& k = it.key();
    if (!name.empty() && k.size() == name.size() &&
        std::equal(k.begin(), k.end(), name.begin(),
                   [](unsigned char a, unsigned char b) { return std::tolower(a) == std::tolower(b); }))
      return k;
  }
  return "";
}

// The one key among `candidates` the record has. As Surogate's rename: the target name itself wins; when
// two or more others are present none is taken (empty).
std::string unique_key(const ordered_json& r, const std::string& target, const std::vector<std::string>& candidates) {
  if (std::string k = key_like(r, target); !k.empty()) return k;
  std::string found;
  int n = 0;
  for (const std::string& c : candidates)
    if (std::string k = key_like(r, c); !k.empty()) found = k, ++n;
  return n == 1 ? found : "";
}

}  // namespace

DatasetType detect_auto(const ordered_json& r, DatasetFields& out) {
  if (!r.is_object()) bad(cat("record is ", r.type_name(), ", expected an object"));
  DatasetFields f = out;  // `out` changes only when a type is found
  const auto found = [&](DatasetType t) {
    out = f;
    return t;
  };
  const std::string system = unique_key(r, "system", {"system_prompt"});
  if (f.system.empty()) f.system = system;
  // Messages: role/content or from/value, told apart by the first message (Surogate's MessagesPreprocessor).
  for (const std::string& name : {f.messages, f.conversations, std::string("conversation")})
    if (const std::string k = key_like(r, name); !k.empty()) {
      const ordered_json& list = r.at(k);
      f.messages = k;
      if (list.is_array() && !list.empty() && list[0].is_object() && !list[0].contains(f.role) &&
          list[0].contains(f.from)) {
        f.role = f.from;
        f.content = f.value;
      }
      return found(DatasetType::kConversation);
    }
  if (!key_like(r, f.instruction).empty() && !key_like(r, f.input).empty()) return found(DatasetType::kInstruction);
  const std::string query = unique_key(r, "query", {"prompt", "input", "instruction", "question", "problem"});
  const std::string response = unique_key(
      r, "response",
      {"answer", "output", "targets", "target", "answer_key", "answers", "solution", "text", "completion", "content"});
  if (query.empty() && r.contains(f.text)) return found(DatasetType::kText);
  if (query.empty() || response.empty())
    bad(cat("cannot detect the dataset type: the first record has no messages, no instruction + input, and no ",
            query.empty() ? "query (query, prompt, input, instruction, question or problem)"
                          : "response (response, answer, output, targets, target, answer_key, answers, solution, "
                            "text, completion or content)",
            " (give the dataset's type: `type:` in a config, FILE:TYPE with --data)"));
  f.instruction = query;
  f.output = response;
  f.input.clear();
  return found(DatasetType::kInstruction);
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

std::string alpaca_chat_prompt(const std::string& instruction, const std::string& input) {
  // Axolotl's AlpacaPrompter with PromptStyle.CHAT (src/axolotl/prompters.py: system_format
  // "SYSTEM: {system}\n", turn_format "USER: {instruction}\n{input}\nASSISTANT:", turn_no_input_format
  // "USER: {instruction}\nASSISTANT:", the same two system prompts as "instruct"); `type: alpaca_chat` loads
  // it (prompt_strategies/alpaca_chat.py). The response follows "ASSISTANT:" with no space.
  if (input.empty())
    return "SYSTEM: Below is an instruction that describes a task. Write a response that appropriately completes "
           "the request.\nUSER: " +
           instruction + "\nASSISTANT:";
  return "SYSTEM: Below is an instruction that describes a task, paired with an input that provides further "
         "context. Write a response that appropriately completes the request.\nUSER: " +
         instruction + "\n" + input + "\nASSISTANT:";
}

std::string format_placeholders(const std::string& format, const std::map<std::string, std::string>& values,
                                const std::string& where) {
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    const char ch = format[i];
    if ((ch == '{' || ch == '}') && i + 1 < format.size() && format[i + 1] == ch) {
      out += ch, ++i;
      continue;
    }
    if (ch == '}') user_error(where, ": a single '}' in \"", format, "\" (write }} for a brace)");
    if (ch != '{') {
      out += ch;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) user_error(where, ": an unclosed '{' in \"", format, "\"");
    const std::string name = format.substr(i + 1, close - i - 1);
    const auto it = values.find(name);
    if (it == values.end()) {
      std::string names;
      for (const auto& [k, v] : values) names += cat(names.empty() ? "" : ", ", "{", k, "}");
      user_error(where, ": {", name, "} in \"", format, "\" (this format takes ", names, ")");
    }
    out += it->second;
    i = close;
  }
  return out;
}

std::vector<std::string> needed_fields(DatasetType type, const DatasetFields& f) {
  std::vector<std::string> out;
  auto add = [&](const std::string& k) {
    if (!k.empty() && std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  };
  const bool any = type == DatasetType::kAuto;
  if (type == DatasetType::kLlamaFactory && f.llama_factory) {
    const LfFormat& l = *f.llama_factory;
    for (const std::string* k :
         {&l.prompt, &l.query, &l.response, &l.history, &l.messages, &l.system, &l.chosen, &l.rejected, &l.kto_tag})
      add(*k);
    return out;
  }
  if (any || type == DatasetType::kText) add(f.text);
  if (any || type == DatasetType::kInstruction || type == DatasetType::kAlpaca || type == DatasetType::kAlpacaChat ||
      type == DatasetType::kUserDefined)
    for (const std::string* k : {&f.instruction, &f.input, &f.output}) add(*k);
  if (any || type == DatasetType::kInputOutput) add(f.segments);
  if (type == DatasetType::kStepwiseSupervised)
    for (const std::string* k : {&f.prompt, &f.completions, &f.labels}) add(*k);
  if (any || type == DatasetType::kConversation) {
    add(f.messages);
    add(f.conversations);
    add(f.completion);
    // The template variables chat templates take besides the messages (tools for function calling,
    // documents for RAG); a JSONL record passes every key, a parquet file only these columns.
    add("tools");
    add("documents");
  }
  add(f.system);
  if (any)  // the columns detect_auto looks for besides the configured ones (Surogate's names)
    for (const char* k :
         {"conversation", "query", "prompt", "question", "problem", "response", "answer", "targets", "target",
          "answer_key", "answers", "solution", "completion", "content", "system", "system_prompt"})
      add(k);
  return out;
}

namespace {

// Axolotl's input_output (prompt_strategies/input_output.py): `segments` is a list of {label, text}; each
// text is tokenized alone, with no special tokens added, and trained when label is true.
std::vector<std::pair<std::string, bool>> segments_of(const ordered_json& r, const DatasetFields& f) {
  auto it = r.find(f.segments);
  if (it == r.end() || it->is_null()) bad(cat("missing field \"", f.segments, "\""));
  if (!it->is_array())
    bad(cat("field \"", f.segments, "\" is ", it->type_name(), ", expected a list of {label, text}"));
  if (it->empty()) bad(cat("field \"", f.segments, "\" is empty"));
  std::vector<std::pair<std::string, bool>> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const ordered_json& s = (*it)[i];
    if (!s.is_object()) bad(cat("segment ", i, " is ", s.type_name(), ", expected {label, text}"));
    const auto label = s.find("label");
    if (label == s.end() || !label->is_boolean()) bad(cat("segment ", i, ": \"label\" must be true or false"));
    try {
      out.emplace_back(string_field(s, "text"), label->get<bool>());
    } catch (const BadRecord& e) {
      bad(cat("segment ", i, ": ", e.what()));
    }
  }
  return out;
}

// stepwise_supervised: `completions` a list of step texts and `labels` one label per step (true / false, or a class
// number below 255), as TRL's PRM datasets (trl-lib/math_shepherd) hold them.
void steps_of(const ordered_json& r, const DatasetFields& f, Sample& s) {
  const auto list = [&](const std::string& key) -> const ordered_json& {
    auto it = r.find(key);
    if (it == r.end() || it->is_null()) bad(cat("missing field \"", key, "\""));
    if (!it->is_array()) bad(cat("field \"", key, "\" is ", it->type_name(), ", expected a list"));
    return *it;
  };
  const ordered_json& steps = list(f.completions);
  const ordered_json& labels = list(f.labels);
  if (steps.empty()) bad(cat("field \"", f.completions, "\" is empty"));
  if (steps.size() != labels.size())
    bad(cat(steps.size(), " steps in \"", f.completions, "\" but ", labels.size(), " labels in \"", f.labels, "\""));
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!steps[i].is_string()) bad(cat("step ", i, " is ", steps[i].type_name(), ", expected a string"));
    const ordered_json& l = labels[i];
    const int64_t v = l.is_boolean() ? int64_t(l.get<bool>()) : l.is_number_integer() ? l.get<int64_t>() : -1;
    if (v < 0 || v > 254) bad(cat("label ", i, " is ", l.dump(), ": expected true, false or a class number 0..254"));
    s.steps.push_back(steps[i].get<std::string>());
    s.step_labels.push_back(f.last_step_label_only && i + 1 < steps.size() ? -1 : int(v));
  }
}

// The record's own system message (field_system), else the dataset's system_prompt.
std::string system_message(const ordered_json& r, const DatasetFields& f) {
  if (!f.system.empty()) {
    bool present = false;
    const std::string& s = string_field(r, f.system, &present);
    if (present && !s.empty()) return s;
  }
  return f.system_prompt;
}

}  // namespace

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
      // Surogate's InstructionPreprocessor (surogate/core/datasets/preprocessor/instruction.py): the user turn
      // is "{instruction}\n{input}", or the instruction alone when the input is missing or empty.
      if (!input.empty()) user += "\n" + input;
      // A list of responses (Surogate's ResponsePreprocessor, e.g. `answers`) trains on the first.
      const auto out = r.find(f.output);
      if (out != r.end() && out->is_array() && !out->empty() && (*out)[0].is_string())
        s.vars["messages"] = user_assistant(std::move(user), (*out)[0].get<std::string>());
      else
        s.vars["messages"] = user_assistant(std::move(user), string_field(r, f.output));
      break;
    }
    case DatasetType::kAlpaca:
    case DatasetType::kAlpacaChat: {
      bool has_input = false;  // the input field is optional: missing or empty is the no-input prompt
      const std::string& instruction = string_field(r, f.instruction);
      const std::string& input = string_field(r, f.input, &has_input);
      const std::string prompt =
          type == DatasetType::kAlpaca ? alpaca_prompt(instruction, input) : alpaca_chat_prompt(instruction, input);
      s.is_text = true;
      s.text = prompt + f.output_prefix + string_field(r, f.output);
      s.prompt_chars = prompt.size();
      return s;
    }
    case DatasetType::kInputOutput:
      s.is_text = true;
      s.segments = segments_of(r, f);
      for (const auto& [text, label] : s.segments) s.text += text;
      return s;
    case DatasetType::kStepwiseSupervised:
      s.is_text = true;
      s.text = string_field(r, f.prompt);
      steps_of(r, f, s);
      return s;
    case DatasetType::kUserDefined: {
      SOLTRAIN_CHECK(f.user_defined.has_value(), "a user-defined dataset without its formats");
      const UserDefinedFormat& u = *f.user_defined;
      bool optional = false, has_system = false;  // (input and output may be missing: "" as Axolotl reads them)
      const std::string instruction = string_field(r, f.instruction);
      const std::string input = string_field(r, f.input, &optional);
      const std::string output = string_field(r, f.output, &optional);
      std::string system = string_field(r, f.system, &has_system);
      if (!has_system) system = u.system_prompt;  // (the record's field when it has one, even empty)
      std::string prompt;
      if (!system.empty() && !u.system_format.empty())
        prompt = format_placeholders(u.system_format, {{"system", system}}, "system_format");
      prompt += input.empty()
                    ? format_placeholders(u.no_input_format, {{"instruction", instruction}}, "no_input_format")
                    : format_placeholders(u.format, {{"instruction", instruction}, {"input", input}}, "format");
      s.is_text = true;
      s.text = prompt + output;
      s.prompt_chars = prompt.size();
      return s;
    }
    case DatasetType::kLlamaFactory: {
      SOLTRAIN_CHECK(f.llama_factory.has_value(), "a llama_factory dataset without its format");
      LfExample x = lf_convert(r, *f.llama_factory);
      if (x.tmpl) {
        s.llama_factory = std::move(x);
        return s;
      }
      // No LLaMA-Factory template named: the converted turns through the tokenizer's chat template.
      if (x.response.size() != 1) bad("not one response: LLaMA-Factory drops such an example");
      ordered_json messages = ordered_json::array();
      if (!x.system.empty()) messages.push_back({{"role", "system"}, {"content", x.system}});
      for (const ordered_json& m : x.prompt) messages.push_back(m);
      messages.push_back(x.response[0]);
      for (ordered_json& m : messages)
        if (m["role"] == "observation") m["role"] = "tool";
      s.vars["messages"] = std::move(messages);
      return s;
    }
    case DatasetType::kConversation: {
      const bool openai = r.contains(f.messages);
      const std::string& key = openai ? f.messages : f.conversations;
      auto it = r.find(key);
      if (it == r.end()) bad(cat("missing field \"", f.messages, "\" or \"", f.conversations, "\""));
      if (!it->is_array()) bad(cat("field \"", key, "\" is ", it->type_name(), ", expected an array"));
      if (it->empty()) bad(cat("field \"", key, "\" is an empty conversation"));
      ordered_json list = *it;
      // Surogate's completion_field: the completion's message(s) follow the prompt's.
      if (const auto c = f.completion.empty() ? r.end() : r.find(f.completion); c != r.end() && !c->is_null()) {
        if (c->is_object())
          list.push_back(*c);
        else if (c->is_array())
          list.insert(list.end(), c->begin(), c->end());
        else
          bad(cat("field \"", f.completion, "\" is ", c->type_name(), ", expected a message or a list of them"));
      }
      s.vars["messages"] = openai ? openai_messages(list, f) : sharegpt_messages(list, f);
      // Other keys (tools, documents, ...) are template variables, as HF's apply_chat_template takes them.
      for (const auto& [k, v] : r.items())
        if (k != f.messages && k != f.conversations && k != f.system && k != f.completion) s.vars[k] = v;
      break;
    }
  }
  ordered_json& messages = s.vars["messages"];
  // Axolotl's drop_system_message (ChatTemplateStrategy): a leading system turn is left out
  if (f.drop_system_message && !messages.empty() && messages[0].value("role", "") == "system")
    messages.erase(messages.begin());
  const std::string system = system_message(r, f);
  if (!system.empty() && !messages.empty() && messages[0]["role"] != "system")
    messages.insert(messages.begin(), ordered_json{{"role", "system"}, {"content", system}});
  if (messages.empty()) bad("no messages left once the system message is dropped");
  return s;
}

}  // namespace soltrain
