#include "data/preference.h"

#include <tuple>

namespace soltrain {

using nlohmann::ordered_json;

std::optional<PreferenceFormat> find_preference_format(std::string_view t) {
  if (t == "auto" || t == "preference" || t == "dpo") return PreferenceFormat::kAuto;
  if (t == "conversational") return PreferenceFormat::kConversational;
  // Axolotl names a DPO type <template>.<shape>; soltrain renders every shape through the chat template
  // (the model's own, or the dataset's / config's chat_template), so only the shape matters here.
  const size_t dot = t.find('.');
  const std::string_view shape = dot == std::string_view::npos ? t : t.substr(dot + 1);
  if (shape == "prompt_pairs") return PreferenceFormat::kPromptPairs;
  if (shape == "intel") return PreferenceFormat::kIntel;
  if (dot != std::string_view::npos && shape == "icr") return PreferenceFormat::kIcr;
  if (dot != std::string_view::npos && shape == "argilla" && t != "chat_template.argilla")
    return PreferenceFormat::kArgilla;
  if (dot != std::string_view::npos && shape == "ultra") return PreferenceFormat::kUltra;
  if (t == "chat_template" || t == "chat_template.default") return PreferenceFormat::kChatTemplate;
  if (t == "chat_template.argilla" || shape == "argilla_chat") return PreferenceFormat::kArgillaChat;
  if (t == "bradley_terry.chat_template") return PreferenceFormat::kBradleyTerry;
  return std::nullopt;
}

namespace {

const ordered_json& field(const ordered_json& r, const std::string& name) {
  const auto it = r.find(name);
  if (it == r.end() || it->is_null()) throw BadRecord(cat("no \"", name, "\" field"));
  return *it;
}

ordered_json message(const std::string& role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

// One message of the data as the template expects it: role mapped, content a string.
ordered_json map_message(const ordered_json& m, const DatasetFields& f) {
  if (!m.is_object()) throw BadRecord("a message is not an object");
  const auto role = m.find(f.role), content = m.find(f.content);
  if (role == m.end() || !role->is_string()) throw BadRecord(cat("a message has no \"", f.role, "\" string"));
  if (content == m.end() || !content->is_string()) throw BadRecord(cat("a message has no \"", f.content, "\" string"));
  const auto r = f.roles.find(role->get<std::string>());
  if (r == f.roles.end()) throw BadRecord(cat("unknown role \"", role->get<std::string>(), "\""));
  return message(r->second, content->get<std::string>());
}

ordered_json map_messages(const ordered_json& list, const DatasetFields& f) {
  ordered_json out = ordered_json::array();
  for (const ordered_json& m : list) out.push_back(map_message(m, f));
  return out;
}

// An answer: a string (one assistant message), one message, or a list of them.
ordered_json answer(const ordered_json& v, const DatasetFields& f, const char* which) {
  ordered_json out;
  if (v.is_string())
    out = ordered_json::array({message("assistant", v.get<std::string>())});
  else if (v.is_object())
    out = ordered_json::array({map_message(v, f)});
  else if (v.is_array())
    out = map_messages(v, f);
  else
    throw BadRecord(cat("\"", which, "\" is neither text nor messages"));
  bool any = false;
  for (const ordered_json& m : out) any |= !m["content"].get<std::string>().empty();
  if (!any) throw BadRecord(cat("the ", which, " answer is empty"));
  return out;
}

ordered_json text_prompt(const ordered_json& r, const std::string& key, const DatasetFields& f) {
  ordered_json p = ordered_json::array();
  const std::string sys_field = f.system.empty() ? "system" : f.system;
  if (const auto s = r.find(sys_field); s != r.end() && s->is_string() && !s->get<std::string>().empty())
    p.push_back(message("system", s->get<std::string>()));
  else if (!f.system_prompt.empty())
    p.push_back(message("system", f.system_prompt));
  const ordered_json& q = field(r, key);
  if (q.is_string())
    p.push_back(message("user", q.get<std::string>()));
  else if (q.is_array())
    for (const ordered_json& m : map_messages(q, f)) p.push_back(m);
  else
    throw BadRecord(cat("\"", key, "\" is neither text nor messages"));
  return p;
}

}  // namespace

PreferenceSample to_preference_sample(const ordered_json& r, PreferenceFormat format, const DatasetFields& f) {
  if (!r.is_object()) throw BadRecord("the record is not an object");
  PreferenceSample s;
  static const ordered_json none;
  const bool argilla = format == PreferenceFormat::kArgilla;  // (its answers are chosen_response / rejected_response)
  const ordered_json& chosen = argilla ? none : field(r, f.chosen);
  const ordered_json& rejected = argilla ? none : field(r, f.rejected);
  if (format == PreferenceFormat::kAuto) {
    if (r.contains("question"))
      format = PreferenceFormat::kIntel;
    else if (chosen.is_object())
      format = PreferenceFormat::kChatTemplate;
    else if (chosen.is_array())
      format = PreferenceFormat::kConversational;
    else
      format = PreferenceFormat::kPromptPairs;
  }
  switch (format) {
    case PreferenceFormat::kIntel: s.prompt = text_prompt(r, "question", f); break;
    case PreferenceFormat::kIcr: s.prompt = text_prompt(r, "input", f); break;
    case PreferenceFormat::kArgilla:
      s.prompt = text_prompt(r, "instruction", f);
      s.chosen = answer(field(r, "chosen_response"), f, "chosen");
      s.rejected = answer(field(r, "rejected_response"), f, "rejected");
      return s;
    case PreferenceFormat::kUltra: {  // (Axolotl's chatml.ultra: chosen[1] and rejected[1], the assistant turns)
      s.prompt = text_prompt(r, f.prompt, f);
      for (auto [side, which, out] : {std::tuple{&chosen, "chosen", &s.chosen}, {&rejected, "rejected", &s.rejected}}) {
        if (!side->is_array() || side->size() < 2 || !(*side)[1].is_object())
          throw BadRecord(cat("\"", which, "\" must be a conversation whose second message is the answer"));
        *out = answer((*side)[1], f, which);
      }
      return s;
    }
    case PreferenceFormat::kBradleyTerry: s.prompt = text_prompt(r, "input", f); break;
    case PreferenceFormat::kPromptPairs: s.prompt = text_prompt(r, f.prompt, f); break;
    case PreferenceFormat::kChatTemplate: {
      const ordered_json& m = field(r, f.messages);
      s.prompt = m.is_string()  ? ordered_json::array({message("user", m.get<std::string>())})
                 : m.is_array() ? map_messages(m, f)
                                : throw BadRecord(cat("\"", f.messages, "\" is not a list of messages"));
      break;
    }
    case PreferenceFormat::kArgillaChat: {
      // Axolotl's ORPO argilla rows: [system] + the chosen conversation up to its last turn, then each side's
      // last message. (Axolotl also puts a `prompt` field's text in every user turn; for the single-turn rows
      // these datasets hold that is the chosen conversation's own user message.)
      if (!chosen.is_array() || !rejected.is_array() || chosen.size() < 2 || rejected.empty())
        throw BadRecord(cat("\"", f.chosen, "\" and \"", f.rejected, "\" must be conversations ending in the answer"));
      const ordered_json c = map_messages(chosen, f);
      s.prompt = ordered_json::array();
      const std::string sys_field = f.system.empty() ? "system" : f.system;
      if (const auto sys = r.find(sys_field); sys != r.end() && sys->is_string() && !sys->get<std::string>().empty())
        s.prompt.push_back(message("system", sys->get<std::string>()));
      for (size_t i = 0; i + 1 < c.size(); ++i) s.prompt.push_back(c[i]);
      s.chosen = answer(chosen.back(), f, "chosen");
      s.rejected = answer(rejected.back(), f, "rejected");
      return s;
    }
    case PreferenceFormat::kConversational:
    case PreferenceFormat::kAuto: {
      // TRL's maybe_extract_prompt: a prompt column is taken when it and the answers are alike (both text, or both
      // messages); a text prompt beside whole conversations (HuggingFaceH4/ultrafeedback_binarized's `prompt`, the
      // first user turn again) is left out and the prompt is what the conversations share.
      if (r.contains(f.prompt) && !r[f.prompt].is_null() && !(r[f.prompt].is_string() && chosen.is_array())) {
        s.prompt = text_prompt(r, f.prompt, f);
        break;
      }
      // TRL's implicit prompt: the messages chosen and rejected share from the start.
      if (!chosen.is_array() || !rejected.is_array())
        throw BadRecord(cat("without a \"", f.prompt, "\" field, \"", f.chosen, "\" and \"", f.rejected,
                            "\" must be message lists sharing their first messages"));
      const ordered_json c = map_messages(chosen, f), rj = map_messages(rejected, f);
      size_t k = 0;
      while (k < c.size() && k < rj.size() && c[k] == rj[k]) ++k;
      if (k == 0) throw BadRecord("chosen and rejected share no prompt message");
      for (size_t i = 0; i < k; ++i) s.prompt.push_back(c[i]);
      ordered_json ca = ordered_json::array(), ra = ordered_json::array();
      for (size_t i = k; i < c.size(); ++i) ca.push_back(c[i]);
      for (size_t i = k; i < rj.size(); ++i) ra.push_back(rj[i]);
      s.chosen = answer(ca, f, "chosen");
      s.rejected = answer(ra, f, "rejected");
      return s;
    }
  }
  s.chosen = answer(chosen, f, "chosen");
  s.rejected = answer(rejected, f, "rejected");
  return s;
}

std::string PreferenceEncoder::render(const ordered_json& messages, bool generation_prompt) const {
  ordered_json v = {{"messages", messages}, {"add_generation_prompt", generation_prompt}};
  try {
    return tmpl_.render(v);
  } catch (const UserError& e) {
    throw BadRecord(e.what());
  }
}

Document PreferenceEncoder::answer(const std::vector<int32_t>& prompt, const std::string& prompt_text,
                                   const ordered_json& answer, const char* which) {
  const std::string full = render(answer, false);  // `answer`: the prompt messages and the answer's
  if (full.compare(0, prompt_text.size(), prompt_text) != 0)
    throw BadRecord(cat("the chat template renders the prompt differently when the ", which,
                        " answer follows (cannot split prompt and answer)"));
  const std::vector<int32_t> ids = tok_.encode(std::string_view(full).substr(prompt_text.size()));
  if (ids.empty()) throw BadRecord(cat("the ", which, " answer renders to no tokens"));
  Document d;
  d.ids = prompt;
  d.mask.assign(prompt.size(), 0);
  const size_t room = size_t(seq_len_) - prompt.size();
  const size_t n = std::min(room, ids.size());
  cut_ += n < ids.size();
  d.ids.insert(d.ids.end(), ids.begin(), ids.begin() + std::ptrdiff_t(n));
  d.mask.resize(d.ids.size(), 1);
  return d;
}

std::pair<std::string, std::vector<int32_t>> PreferenceEncoder::prompt_ids(const ordered_json& messages) {
  std::string prompt_text = render(messages, true);
  std::vector<int32_t> prompt = tok_.encode(prompt_text);
  if (max_prompt_len_ > 0 && int64_t(prompt.size()) > max_prompt_len_)
    prompt.erase(prompt.begin(), prompt.end() - std::ptrdiff_t(max_prompt_len_));
  if (int64_t(prompt.size()) >= seq_len_)
    throw BadRecord(cat("the prompt is ", prompt.size(), " tokens, no room for an answer in sequence_len ", seq_len_,
                        " (set max_prompt_len to cut prompts)"));
  return {std::move(prompt_text), std::move(prompt)};
}

namespace {
ordered_json followed_by(ordered_json prompt, const ordered_json& answer) {
  for (const ordered_json& x : answer) prompt.push_back(x);
  return prompt;
}
}  // namespace

std::pair<Document, Document> PreferenceEncoder::encode(const PreferenceSample& s) {
  const auto [prompt_text, prompt] = prompt_ids(s.prompt);
  return {answer(prompt, prompt_text, followed_by(s.prompt, s.chosen), "chosen"),
          answer(prompt, prompt_text, followed_by(s.prompt, s.rejected), "rejected")};
}

Document PreferenceEncoder::encode(const UnpairedSample& s) {
  const auto [prompt_text, prompt] = prompt_ids(s.prompt);
  return answer(prompt, prompt_text, followed_by(s.prompt, s.completion), "completion");
}

bool is_unpaired_format(std::string_view t) {
  if (t == "auto" || t == "kto" || t == "unpaired") return true;
  const size_t dot = t.find('.');
  if (dot == std::string_view::npos) return false;
  const std::string_view shape = t.substr(dot + 1);
  return shape == "ultra" || shape == "argilla" || shape == "argilla_chat" || shape == "intel";
}

UnpairedSample to_unpaired_sample(const ordered_json& r, const DatasetFields& f) {
  if (!r.is_object()) throw BadRecord("the record is not an object");
  UnpairedSample s;
  const ordered_json& label = field(r, "label");
  if (label.is_boolean())
    s.desirable = label.get<bool>();
  else if (label.is_number_integer() && (label.get<int64_t>() == 0 || label.get<int64_t>() == 1))
    s.desirable = label.get<int64_t>() == 1;
  else
    throw BadRecord("\"label\" is not true or false");
  const ordered_json& completion = field(r, "completion");
  const std::string key = r.contains(f.prompt) ? f.prompt : r.contains("instruction") ? "instruction" : "question";
  if (!r.contains(key) && completion.is_array() && completion.size() >= 2) {
    // argilla_chat rows (argilla/kto-mix-15k): the conversation is the prompt, its last message the completion
    const ordered_json c = map_messages(completion, f);
    for (size_t i = 0; i + 1 < c.size(); ++i) s.prompt.push_back(c[i]);
    s.completion = answer(completion.back(), f, "completion");
    return s;
  }
  s.prompt = text_prompt(r, key, f);
  s.completion = answer(completion, f, "completion");
  return s;
}

}  // namespace soltrain
