#include "tokenizer/tokenizer_edits.h"

#include <algorithm>
#include <set>

#include "core/error.h"

namespace soltrain {

namespace {

using nlohmann::json;

const char* const kRoles[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                              "sep_token", "cls_token", "mask_token"};

// The ids the post_processor puts around a sequence by token string (TemplateProcessing's special_tokens), so a
// BOS change it would not follow is seen.
std::set<std::string> post_processor_tokens(const json& p) {
  std::set<std::string> out;
  if (!p.is_object()) return out;
  if (p.value("type", "") == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
    for (const json& q : p["processors"])
      for (const std::string& s : post_processor_tokens(q)) out.insert(s);
    return out;
  }
  if (p.contains("special_tokens") && p["special_tokens"].is_object())
    for (const auto& [name, v] : p["special_tokens"].items()) out.insert(name);
  return out;
}

class Editor {
 public:
  Editor(EditedTokenizer& out, const std::string& where) : out_(out), where_(where) {
    json& t = out_.tokenizer;
    if (!t.contains("model") || !t["model"].is_object() || !t["model"].contains("vocab") ||
        !t["model"]["vocab"].is_object())
      user_error(where_, ": tokenizer.json has no model.vocab map (soltrain edits BPE tokenizers)");
    if (!t.contains("added_tokens") || t["added_tokens"].is_null()) t["added_tokens"] = json::array();
    if (!t["added_tokens"].is_array()) user_error(where_, ": tokenizer.json's added_tokens is not a list");
  }

  json& added() { return out_.tokenizer["added_tokens"]; }
  json& vocab() { return out_.tokenizer["model"]["vocab"]; }

  // HF tokenizers' AddedVocabulary::add_tokens for one AddedToken(content, lstrip/rstrip/single_word false,
  // normalized false, special): its id.
  int32_t add(const std::string& content, bool special) {
    if (content.empty()) user_error(where_, ": an added token cannot be empty");
    json entry = {{"content", content}, {"single_word", false}, {"lstrip", false},
                  {"rstrip", false},    {"normalized", false},  {"special", special}};
    for (const json& a : added())  // already added: left as it is (tokenizers compares added tokens by content)
      if (a.value("content", "") == content) return a["id"].get<int32_t>();
    int64_t id;
    if (const auto it = vocab().find(content); it != vocab().end()) {
      id = it->get<int64_t>();  // in the vocabulary: marked as added, matched whole from now on
    } else {
      const int64_t model = int64_t(vocab().size());
      int64_t top = -1;
      for (const json& a : added()) top = std::max(top, a.value("id", int64_t(-1)));
      id = top < 0 ? model : (top >= model || model == 0 ? top + 1 : model);
      out_.added.emplace_back(content, int32_t(id));
    }
    entry["id"] = id;
    added().push_back(entry);
    record_decoder(entry);
    return int32_t(id);
  }

  // transformers keeps tokenizer_config.json's added_tokens_decoder beside tokenizer.json's list.
  void record_decoder(const json& entry) {
    json& c = out_.config;
    if (!c.contains("added_tokens_decoder") || !c["added_tokens_decoder"].is_object())
      c["added_tokens_decoder"] = json::object();
    json d = entry;
    d.erase("id");
    c["added_tokens_decoder"][std::to_string(entry["id"].get<int64_t>())] = d;
  }

  void rename(int32_t id, const std::string& content) {  // Axolotl's modify_tokenizer_files
    const std::string key = std::to_string(id);
    json& c = out_.config;
    if (c.contains("added_tokens_decoder") && c["added_tokens_decoder"].is_object()) {
      if (!c["added_tokens_decoder"].contains(key))
        user_error(where_, ": added_tokens_overrides: ", id, " is not in tokenizer_config.json's added_tokens_decoder");
      c["added_tokens_decoder"][key]["content"] = content;
    }
    bool found = false;
    for (json& a : added())
      if (a.value("id", int64_t(-1)) == id) {
        a["content"] = content;
        found = true;
        break;
      }
    if (!found) user_error(where_, ": added_tokens_overrides: ", id, " is not an added token of tokenizer.json");
    for (auto it = vocab().begin(); it != vocab().end(); ++it)
      if (it->get<int64_t>() == id) {
        vocab().erase(it.key());
        vocab()[content] = id;
        break;
      }
  }

  void set_role(const std::string& role, const std::string& token) {
    json& c = out_.config;
    if (c.contains(role) && c[role].is_object())
      c[role]["content"] = token;  // the older form: an AddedToken's fields
    else
      c[role] = token;
  }

 private:
  EditedTokenizer& out_;
  const std::string& where_;
};

}  // namespace

std::string special_token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

EditedTokenizer edit_tokenizer(const json& tokenizer_json, const json& tokenizer_config, const TokenizerEdits& e,
                               const std::string& where) {
  EditedTokenizer out{tokenizer_json, tokenizer_config.is_object() ? tokenizer_config : json::object(), {}, 0};
  Editor ed(out, where);
  for (const auto& [id, content] : e.overrides) ed.rename(id, content);
  const std::set<std::string> around = post_processor_tokens(tokenizer_json.value("post_processor", json()));
  for (const auto& [role, token] : e.special) {
    if (std::find(std::begin(kRoles), std::end(kRoles), role) == std::end(kRoles))
      user_error("special_tokens: ", role,
                 ": not a special-token role (bos_token, eos_token, unk_token, pad_token, sep_token, cls_token, "
                 "mask_token, additional_special_tokens)");
    const std::string before = special_token_text(out.config.value(role, json()));
    // transformers 5 rebuilds no post_processor when the BOS changes (Axolotl calls update_post_processor for a
    // LlamaTokenizerFast only, a class name transformers 5 no longer gives): texts still start with the old BOS
    if (role == "bos_token" && before != token && around.count(before))
      out.notes.push_back(cat("special_tokens: bos_token \"", token,
                              "\": tokenizer.json's post_processor still puts \"", before,
                              "\" before every text, as transformers 5 (and so Axolotl) leaves it"));
    ed.add(token, true);
    ed.set_role(role, token);
  }
  for (const std::string& t : e.tokens) ed.add(t, false);
  if (e.has_additional) {
    for (const std::string& t : e.additional_special) ed.add(t, true);
    // transformers 5 names the list extra_special_tokens; an older config keeps its own name
    const char* key =
        out.config.contains("extra_special_tokens") ? "extra_special_tokens" : "additional_special_tokens";
    out.config[key] = e.additional_special;
  }
  if (!e.chat_template.empty())
    out.config["chat_template"] = e.chat_template;  // (saved with the tokenizer, as Axolotl)
  std::stable_sort(ed.added().begin(), ed.added().end(),
                   [](const json& a, const json& b) { return a.value("id", int64_t(0)) < b.value("id", int64_t(0)); });
  std::set<std::string> distinct;
  for (const auto& [k, v] : ed.vocab().items()) distinct.insert(k);
  for (const json& a : ed.added()) distinct.insert(a.value("content", ""));
  out.length = int64_t(distinct.size());
  return out;
}

}  // namespace soltrain
