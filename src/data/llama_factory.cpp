#include "data/llama_factory.h"

#include <map>

#include "core/error.h"
#include "data/dataset.h"

namespace soltrain {

using nlohmann::ordered_json;

namespace {

const std::string kBos(kLfBos), kEos(kLfEos);

// template.py's rows for the text-only templates of the Llama, Qwen and Mistral families and the generic ones
// (v0.9.5). Unset formats take register_template's defaults: user and system "{{content}}", assistant
// "{{content}}" + eos, observation the user's.
std::vector<LfTemplate> make_templates() {
  const std::string im = "<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n";
  const LfTemplate qwen_like{"qwen",
                             {im},
                             {"{{content}}<|im_end|>\n"},
                             {"<|im_start|>system\n{{content}}<|im_end|>\n"},
                             {"<|im_start|>user\n<tool_response>\n{{content}}\n</tool_response><|im_end|>\n"
                              "<|im_start|>assistant\n"},
                             {},
                             "",
                             {"<|im_end|>"},
                             true};
  LfTemplate qwen = qwen_like;
  qwen.default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
  LfTemplate qwen3_nothink = qwen_like;
  qwen3_nothink.name = "qwen3_nothink";
  LfTemplate qwen3 = qwen_like;
  qwen3.name = "qwen3";
  qwen3.reasoning = true;
  LfTemplate chatml{"chatml",
                    {im},
                    {"{{content}}<|im_end|>\n"},
                    {"<|im_start|>system\n{{content}}<|im_end|>\n"},
                    {"<|im_start|>tool\n{{content}}<|im_end|>\n<|im_start|>assistant\n"},
                    {},
                    "",
                    {"<|im_end|>", "<|im_start|>"},
                    true};
  const std::string hdr = "<|start_header_id|>";
  LfTemplate llama3{
      "llama3",
      {hdr + "user<|end_header_id|>\n\n{{content}}<|eot_id|>" + hdr + "assistant<|end_header_id|>\n\n"},
      {"{{content}}<|eot_id|>"},
      {hdr + "system<|end_header_id|>\n\n{{content}}<|eot_id|>"},
      {hdr + "ipython<|end_header_id|>\n\n{{content}}<|eot_id|>" + hdr + "assistant<|end_header_id|>\n\n"},
      {kBos},
      "",
      {"<|eot_id|>", "<|eom_id|>"},
      true};
  LfTemplate llama2{"llama2",
                    {kBos, "[INST] {{content}} [/INST]"},
                    {"{{content}}", kEos},
                    {"<<SYS>>\n{{content}}\n<</SYS>>\n\n"},
                    {kBos, "[INST] {{content}} [/INST]"},
                    {},
                    "",
                    {},
                    false,
                    true};
  LfTemplate mistral{"mistral",
                     {"[INST] {{content}}[/INST]"},
                     {" {{content}}", kEos},
                     {"{{content}}\n\n"},
                     {"[TOOL_RESULTS] {\"content\": {{content}}}[/TOOL_RESULTS]"},
                     {kBos},
                     "",
                     {},
                     false,
                     true};
  LfTemplate def{"default",
                 {"Human: {{content}}", kEos, "\nAssistant:"},
                 {"{{content}}", kEos, "\n"},
                 {"System: {{content}}", kEos, "\n"},
                 {"Human: {{content}}", kEos, "\nAssistant:"},
                 {},
                 "",
                 {},
                 false};
  LfTemplate empty{"empty", {"{{content}}"}, {"{{content}}"}, {"{{content}}"}, {"{{content}}"}, {}, "", {}, false};
  LfTemplate alpaca{"alpaca",
                    {"### Instruction:\n{{content}}\n\n### Response:\n"},
                    {"{{content}}", kEos, "\n\n"},
                    {"{{content}}"},
                    {"### Instruction:\n{{content}}\n\n### Response:\n"},
                    {},
                    "Below is an instruction that describes a task. Write a response that appropriately completes "
                    "the request.\n\n",
                    {},
                    false};
  return {qwen, qwen3_nothink, qwen3, chatml, llama3, llama2, mistral, def, empty, alpaca};
}

const std::vector<LfTemplate>& templates() {
  static const std::vector<LfTemplate> t = make_templates();
  return t;
}

[[noreturn]] void skip(const std::string& why) {
  throw BadRecord(why);
}

// A column's string value ("" when the column is absent or null, as LLaMA-Factory's falsy checks read it).
std::string text_of(const ordered_json& r, const std::string& column) {
  if (column.empty()) return "";
  const auto it = r.find(column);
  if (it == r.end() || it->is_null()) return "";
  if (!it->is_string()) skip(cat("column \"", column, "\" is ", it->type_name(), ", expected a string"));
  return it->get<std::string>();
}

ordered_json message(const std::string& role, std::string content) {
  return {{"role", role}, {"content", std::move(content)}};
}

// LF's `example[kto_tag]` when it is a bool (anything else: not a KTO example).
std::optional<bool> kto_tag(const ordered_json& r, const LfFormat& f) {
  if (f.kto_tag.empty()) return std::nullopt;
  const auto it = r.find(f.kto_tag);
  if (it == r.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

LfExample convert_alpaca(const ordered_json& r, const LfFormat& f) {
  LfExample e;
  if (!f.history.empty())
    if (const auto h = r.find(f.history); h != r.end() && h->is_array())
      for (const ordered_json& turn : *h) {
        if (!turn.is_array() || turn.size() != 2 || !turn[0].is_string() || !turn[1].is_string())
          skip(cat("history turn ", turn.dump(), " is not [prompt, response]"));
        e.prompt.push_back(message("user", turn[0].get<std::string>()));
        e.prompt.push_back(message("assistant", turn[1].get<std::string>()));
      }
  std::string query = text_of(r, f.prompt);
  if (const std::string q = text_of(r, f.query); !q.empty()) query += query.empty() ? q : "\n" + q;
  e.prompt.push_back(message("user", query));
  e.system = text_of(r, f.system);
  const auto is_string = [&](const std::string& c) { return !c.empty() && r.contains(c) && r.at(c).is_string(); };
  if ((e.kto_tag = kto_tag(r, f))) {
    const ordered_json answer = message("assistant", text_of(r, f.response));
    e.response =
        *e.kto_tag ? ordered_json{answer, message("assistant", "")} : ordered_json{message("assistant", ""), answer};
  } else if (f.ranking && is_string(f.chosen) && is_string(f.rejected)) {
    e.response = {message("assistant", text_of(r, f.chosen)), message("assistant", text_of(r, f.rejected))};
  } else if (is_string(f.response)) {
    e.response = {message("assistant", text_of(r, f.response))};
  }
  return e;
}

LfExample convert_sharegpt(const ordered_json& r, const LfFormat& f) {
  const auto role_of = [&](const std::string& tag) -> std::string {
    if (tag == f.user_tag) return "user";
    if (tag == f.assistant_tag) return "assistant";
    if (tag == f.observation_tag) return "observation";
    if (tag == f.function_tag) return "function";
    return "system";
  };
  const auto it = r.find(f.messages);
  if (it == r.end() || !it->is_array()) skip(cat("column \"", f.messages, "\" is not a list of messages"));
  const auto field = [&](const ordered_json& m, const std::string& k) -> std::string {
    if (!m.is_object() || !m.contains(k) || !m.at(k).is_string())
      skip(cat("message ", m.dump(), " has no \"", k, "\""));
    return m.at(k).get<std::string>();
  };
  std::vector<ordered_json> messages(it->begin(), it->end());
  LfExample e;
  if (!f.system_tag.empty() && !messages.empty() && field(messages[0], f.role_tag) == f.system_tag) {
    e.system = field(messages[0], f.content_tag);
    messages.erase(messages.begin());
  } else {
    e.system = text_of(r, f.system);
  }
  ordered_json aligned = ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string tag = field(messages[i], f.role_tag);
    const bool odd_ok = tag == f.user_tag || tag == f.observation_tag;
    const bool even_ok = tag == f.assistant_tag || tag == f.function_tag;
    if (!(i % 2 == 0 ? odd_ok : even_ok))
      skip(cat("message ", i, " has role \"", tag, "\" out of turn (LLaMA-Factory skips such an example)"));
    aligned.push_back(message(role_of(tag), field(messages[i], f.content_tag)));
  }
  if (f.ranking == (aligned.size() % 2 == 0))
    skip(cat(aligned.size(),
             " messages: ", f.ranking ? "a preference prompt ends with the user's turn" : "turns must pair up",
             " (LLaMA-Factory skips such an example)"));
  if ((e.kto_tag = kto_tag(r, f))) {
    e.response = {aligned.back()};
    aligned.erase(aligned.end() - 1);
    e.prompt = aligned;
    e.response = *e.kto_tag ? ordered_json{e.response[0], message("assistant", "")}
                            : ordered_json{message("assistant", ""), e.response[0]};
  } else if (f.ranking && r.contains(f.chosen) && r.at(f.chosen).is_object() && r.contains(f.rejected) &&
             r.at(f.rejected).is_object()) {
    const ordered_json &c = r.at(f.chosen), &j = r.at(f.rejected);
    for (const ordered_json* a : {&c, &j}) {
      const std::string tag = field(*a, f.role_tag);
      if (tag != f.assistant_tag && tag != f.function_tag) skip(cat("an answer has role \"", tag, "\""));
    }
    e.prompt = aligned;
    e.response = {message(role_of(field(c, f.role_tag)), field(c, f.content_tag)),
                  message(role_of(field(j, f.role_tag)), field(j, f.content_tag))};
  } else {
    if (aligned.empty()) skip("no messages");
    e.response = {aligned.back()};
    aligned.erase(aligned.end() - 1);
    e.prompt = aligned;
  }
  return e;
}

// StringFormatter.apply: "{{content}}" replaced once in each text slot.
void apply(const std::vector<std::string>& slots, const std::string& content, std::vector<std::string>& out) {
  for (const std::string& s : slots) {
    if (s == kBos || s == kEos) {
      out.push_back(s);
      continue;
    }
    std::string t = s;
    if (const size_t at = t.find("{{content}}"); at != std::string::npos) t.replace(at, 11, content);
    out.push_back(std::move(t));
  }
}

std::string text_at(const nlohmann::json& info, const char* key, const std::string& where, const std::string& def) {
  const auto it = info.find(key);
  if (it == info.end() || it->is_null()) return def;
  if (!it->is_string()) user_error(where, ": \"", key, "\" is ", it->type_name(), ", expected a string");
  return it->get<std::string>();
}

}  // namespace

const LfTemplate* find_lf_template(std::string_view name) {
  for (const LfTemplate& t : templates())
    if (t.name == name) return &t;
  return nullptr;
}

std::string lf_template_names() {
  std::string s;
  for (const LfTemplate& t : templates()) s += (s.empty() ? "" : ", ") + t.name;
  return s;
}

LfFormat read_lf_format(const nlohmann::json& info, const std::string& where) {
  if (!info.is_object()) user_error(where, ": a dataset_info.json entry is ", info.type_name(), ", expected an object");
  LfFormat f;
  const std::string formatting = text_at(info, "formatting", where, "alpaca");
  if (formatting != "alpaca" && formatting != "sharegpt")
    user_error(where, ": formatting \"", formatting, "\": soltrain reads LLaMA-Factory's alpaca and sharegpt formats");
  f.sharegpt = formatting == "sharegpt";
  if (const auto r = info.find("ranking"); r != info.end() && !r->is_null()) {
    if (!r->is_boolean()) user_error(where, ": \"ranking\" is ", r->type_name(), ", expected true or false");
    f.ranking = r->get<bool>();
  }
  if (!f.sharegpt) f.messages.clear();
  if (f.sharegpt) f.prompt.clear(), f.query.clear(), f.response.clear();
  if (const auto c = info.find("columns"); c != info.end() && !c->is_null()) {
    if (!c->is_object()) user_error(where, ": \"columns\" is ", c->type_name(), ", expected an object");
    for (const auto& [k, v] : c->items()) {
      if (!v.is_string()) user_error(where, ": columns.", k, " is ", v.type_name(), ", expected a column name");
      static const std::map<std::string, std::string LfFormat::*> columns{
          {"prompt", &LfFormat::prompt},   {"query", &LfFormat::query},       {"response", &LfFormat::response},
          {"history", &LfFormat::history}, {"messages", &LfFormat::messages}, {"system", &LfFormat::system},
          {"chosen", &LfFormat::chosen},   {"rejected", &LfFormat::rejected}, {"kto_tag", &LfFormat::kto_tag}};
      if (const auto it = columns.find(k); it != columns.end())
        f.*(it->second) = v.get<std::string>();
      else if (k == "images" || k == "videos" || k == "audios" || k == "tools")
        user_error(where, ": columns.", k, ": soltrain trains text-only models without tool descriptions (the ", k,
                   " column is not read)");
      else
        user_error(where, ": columns.", k, " is not a LLaMA-Factory column (prompt, query, response, history, ",
                   "messages, system, chosen, rejected, kto_tag)");
    }
  }
  f.template_name = text_at(info, "template", where, "");
  if (const auto c = info.find("cutoff_len"); c != info.end() && !c->is_null()) {
    if (!c->is_number_integer() || c->get<int64_t>() < 1) user_error(where, ": cutoff_len must be an integer >= 1");
    f.cutoff_len = c->get<int64_t>();
  }
  if (const auto t = info.find("train_on_prompt"); t != info.end() && !t->is_null()) {
    if (!t->is_boolean()) user_error(where, ": train_on_prompt must be true or false");
    f.train_on_prompt = t->get<bool>();
  }
  if (!f.template_name.empty() && !find_lf_template(f.template_name))
    user_error(where, ": template ", f.template_name, " is not one soltrain renders (", lf_template_names(), ")");
  if (const auto t = info.find("tags"); t != info.end() && !t->is_null()) {
    if (!t->is_object()) user_error(where, ": \"tags\" is ", t->type_name(), ", expected an object");
    for (const auto& [k, v] : t->items()) {
      if (!v.is_string()) user_error(where, ": tags.", k, " is ", v.type_name(), ", expected a string");
      static const std::map<std::string, std::string LfFormat::*> tags{{"role_tag", &LfFormat::role_tag},
                                                                       {"content_tag", &LfFormat::content_tag},
                                                                       {"user_tag", &LfFormat::user_tag},
                                                                       {"assistant_tag", &LfFormat::assistant_tag},
                                                                       {"observation_tag", &LfFormat::observation_tag},
                                                                       {"function_tag", &LfFormat::function_tag},
                                                                       {"system_tag", &LfFormat::system_tag}};
      const auto it = tags.find(k);
      std::string* slot = it == tags.end() ? nullptr : &(f.*(it->second));
      if (!slot) user_error(where, ": tags.", k, " is not a LLaMA-Factory tag");
      *slot = v.get<std::string>();
    }
  }
  return f;
}

nlohmann::json lf_format_json(const LfFormat& f) {
  return {{"sharegpt", f.sharegpt},
          {"ranking", f.ranking},
          {"prompt", f.prompt},
          {"query", f.query},
          {"response", f.response},
          {"history", f.history},
          {"messages", f.messages},
          {"system", f.system},
          {"chosen", f.chosen},
          {"rejected", f.rejected},
          {"kto_tag", f.kto_tag},
          {"role_tag", f.role_tag},
          {"content_tag", f.content_tag},
          {"user_tag", f.user_tag},
          {"assistant_tag", f.assistant_tag},
          {"observation_tag", f.observation_tag},
          {"function_tag", f.function_tag},
          {"system_tag", f.system_tag},
          {"template", f.template_name},
          {"cutoff_len", f.cutoff_len},
          {"train_on_prompt", f.train_on_prompt},
          {"rendering", 1}};
}

LfExample lf_convert(const ordered_json& record, const LfFormat& f) {
  if (!record.is_object()) skip(cat("record is ", record.type_name(), ", expected an object"));
  LfExample x = f.sharegpt ? convert_sharegpt(record, f) : convert_alpaca(record, f);
  x.tmpl = f.template_name.empty() ? nullptr : find_lf_template(f.template_name);
  x.cutoff_len = f.cutoff_len;
  x.train_on_prompt = f.train_on_prompt;
  return x;
}

std::vector<std::vector<std::string>> lf_render(const LfTemplate& t, const ordered_json& messages,
                                                const std::string& system_text) {
  const std::string system = system_text.empty() ? t.default_system : system_text;
  std::vector<std::vector<std::string>> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    std::vector<std::string> elements;
    std::string first_user_prefix;
    if (i == 0) {
      elements.insert(elements.end(), t.prefix.begin(), t.prefix.end());
      if (!system.empty()) {
        if (t.system_in_first_user) {  // Llama2Template: the system slot's text, then the first user content
          std::vector<std::string> s;
          apply(t.system, system, s);
          first_user_prefix = s.at(0);
        } else {
          apply(t.system, system, elements);
        }
      }
    }
    const std::string role = messages[i].at("role").get<std::string>();
    const std::string content = messages[i].at("content").get<std::string>();
    if (role == "user")
      apply(t.user, first_user_prefix + content, elements);
    else if (role == "assistant")
      apply(t.assistant, content, elements);
    else if (role == "observation")
      apply(t.observation, content, elements);
    else  // (function: LLaMA-Factory's FunctionFormatter rewrites the JSON call in a tool format of the template's)
      throw BadRecord(cat("a ", role, " turn: soltrain does not render LLaMA-Factory's function-call turns"));
    out.push_back(std::move(elements));
  }
  return out;
}

std::pair<int64_t, int64_t> lf_infer_seqlen(int64_t source_len, int64_t target_len, int64_t cutoff_len) {
  int64_t max_target_len;
  if (target_len * 2 < cutoff_len)
    max_target_len = cutoff_len;
  else if (source_len * 2 < cutoff_len)
    max_target_len = cutoff_len - source_len;
  else
    max_target_len = int64_t(double(cutoff_len) * (double(target_len) / double(source_len + target_len)));
  const int64_t new_target = std::min(max_target_len, target_len);
  const int64_t max_source = std::max<int64_t>(cutoff_len - new_target, 0);
  return {std::min(max_source, source_len), new_target};
}

}  // namespace soltrain
