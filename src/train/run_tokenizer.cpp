#include "train/run_tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/input_file.h"
#include "io/json_file.h"
#include "io/sha256.h"
#include "model/config.h"
#include "tokenizer/tekken.h"
#include "tokenizer/tokenizer.h"

namespace soltrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path model_folder(const TrainConfig& c) {
  return fs::is_directory(c.model) ? c.model : c.model.parent_path();
}

// Axolotl's checks (its config validation for tokens, loaders/tokenizer.py for special_tokens): new token rows
// under an adapter must train in full, or they stay at their initial values while the adapter learns to use them.
void check_adapter_trains_new_rows(const TrainConfig& c, const json& tokenizer_json, const json& config) {
  if (!c.lora.enabled) return;
  const auto& m = c.lora.modules_to_save;
  const bool full = std::count(m.begin(), m.end(), "embed_tokens") && std::count(m.begin(), m.end(), "lm_head");
  if (full) return;
  if (!c.tokenizer_edits.tokens.empty())
    user_error(
        "tokens: new tokens with an adapter need lora_modules_to_save: [embed_tokens, lm_head] (their "
        "rows train in full beside the adapter; Axolotl asks the same)");
  Tokenizer tok = Tokenizer::from_json(tokenizer_json);
  for (const auto& [role, token] : c.tokenizer_edits.special) {
    const std::string before = special_token_text(config.value(role, json()));
    // (Axolotl's test: a token the tokenizer splits into more than two pieces is taken to be new; pad never)
    if (role != "pad_token" && before != token && tok.encode(token).size() > 2)
      user_error("special_tokens: ", role, " \"", token,
                 "\" is new: with an adapter set lora_modules_to_save: [embed_tokens, lm_head] (Axolotl asks the "
                 "same)");
  }
}

}  // namespace

namespace {

// The edited tokenizer's folder, appearing whole or not at all: written under a name of this process's own, then
// renamed into place; when another run got there first (the same content: the name is its hash), ours is dropped.
// (No lock: the shards' lock on dataset_prepared_path may be held by this very process while it tokenizes.)
void write_folder_once(const fs::path& out, const fs::path& model_dir, const std::string& tok_text,
                       const std::string& cfg_text) {
  fs::create_directories(out.parent_path());
  const fs::path tmp = out.parent_path() / cat(".", out.filename().string(), ".partial-", ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  // the model's other tokenizer files stay beside them
  // (not a chat_template.jinja when the written config carries the template the run used: transformers would
  // read the file first)
  const bool own_template = json::parse(cfg_text).contains("chat_template");
  for (const char* n : {"special_tokens_map.json", "chat_template.jinja", "added_tokens.json", "vocab.json",
                        "merges.txt", "tokenizer.model"})
    if (fs::is_regular_file(model_dir / n) && !(own_template && std::string(n) == "chat_template.jinja"))
      fs::copy_file(model_dir / n, tmp / n);
  write_file_atomic(tmp / "tokenizer.json", tok_text);
  write_file_atomic(tmp / "tokenizer_config.json", cfg_text);
  if (::rename(tmp.c_str(), out.c_str()) != 0) {
    const int err = errno;
    fs::remove_all(tmp);
    if (!fs::exists(out / "tokenizer.json"))
      user_error(out.string(), ": cannot write the run's tokenizer (", std::strerror(err), ")");
  }
}

RunTokenizer resolve(const TrainConfig& c) {
  RunTokenizer r;
  const fs::path dir = model_folder(c);
  r.folder = dir;
  const fs::path tok_file = dir / "tokenizer.json", cfg_file = dir / "tokenizer_config.json";
  const fs::path tekken_file = dir / "tekken.json";
  // mistral-common's tekken.json, asked for or the only tokenizer there: converted as transformers converts it,
  // with mistral-common's chat format for its version, into a copy the run tokenizes with and saves
  const bool tekken = c.mistral_common || (!fs::exists(tok_file) && fs::exists(tekken_file));
  if (c.mistral_common && !fs::exists(tekken_file))
    user_error("tokenizer_use_mistral_common: ", dir.string(), " has no tekken.json");
  if (!tekken && !fs::exists(tok_file)) {
    if (!c.tokenizer_edits.empty())
      user_error(tok_file.string(), ": no tokenizer.json to add tokens to (tokens / special_tokens)");
    return r;
  }
  json tokenizer_json, config;
  if (tekken) {
    TekkenConversion t = convert_tekken(tekken_file);
    tokenizer_json = std::move(t.tokenizer), config = std::move(t.config);
    // (without the key, the repository's own template where it has one, as transformers' conversion takes it)
    const bool own = !c.mistral_common && fs::is_regular_file(dir / "chat_template.jinja");
    if (own) config["chat_template"] = read_input_file(dir / "chat_template.jinja", "chat template");
    r.notes.push_back(cat("tokenizer: ", tekken_file.string(), " (mistral-common's tekken ", t.version,
                          ") converted to tokenizer.json, with ",
                          own ? "the folder's chat_template.jinja" : "mistral-common's " + t.version + " chat format",
                          c.mistral_common ? "" : " (the folder has no tokenizer.json)"));
  } else {
    tokenizer_json = read_json_file(tok_file);
    config = fs::exists(cfg_file) ? read_json_file(cfg_file) : json::object();
  }
  const EditedTokenizer e =
      edit_tokenizer(tokenizer_json, config, c.tokenizer_edits, (tekken ? tekken_file : tok_file).string());
  for (const std::string& note : e.notes) r.notes.push_back(note);
  // (edits that change nothing, e.g. a LLaMA-Factory template's eos that already is the tokenizer's: no copy)
  const bool changed = tekken || e.tokenizer != tokenizer_json || e.config != config;
  if ((tekken || !c.tokenizer_edits.empty()) && changed) {
    check_adapter_trains_new_rows(c, tokenizer_json, config);
    const std::string tok_text = e.tokenizer.dump(2) + "\n", cfg_text = e.config.dump(2) + "\n";
    const fs::path out = c.dataset_prepared_path / ("tokenizer-" + sha256_hex(tok_text + cfg_text).substr(0, 16));
    if (!fs::exists(out / "tokenizer.json") || !fs::exists(out / "tokenizer_config.json"))
      write_folder_once(out, dir, tok_text, cfg_text);
    r.folder = out;
    std::string said;
    for (const auto& [role, token] : c.tokenizer_edits.special) said += cat(said.empty() ? "" : ", ", role, " ", token);
    std::string added;
    for (const auto& [t, id] : e.added) added += cat(added.empty() ? "" : ", ", t, " = ", id);
    if (!c.tokenizer_edits.chat_template.empty())
      said += cat(said.empty() ? "" : ", ", "chat_template_jinja's template");
    if (c.tokenizer_edits.empty())
      r.notes.push_back(cat("tokenizer: the run tokenizes with and saves ", out.string()));
    else
      r.notes.push_back(cat("tokenizer: ", said.empty() ? "" : said + "; ", e.added.size(), " new tokens",
                            added.empty() ? "" : " (" + added + ")", "; the run tokenizes with and saves ",
                            out.string()));
  }
  // transformers' resize_token_embeddings(len(tokenizer), rounded up to 32 with resize_token_embeddings_to_32x),
  // when the model has fewer rows (or more, with shrink_embeddings), as Axolotl's model loader calls it
  if (!fs::exists(dir / "config.json")) return r;  // (a tokenizer folder preparing data only: no weights to resize)
  const ModelConfig m = load_model_config(c.model);
  const int64_t want = c.resize_to_32x ? (e.length + 31) / 32 * 32 : e.length;
  if (m.vocab_size < want || (m.vocab_size > want && c.shrink_embeddings)) {
    r.vocab_resize = int(want);
    r.notes.push_back(cat("tokenizer: the embedding", m.tie_word_embeddings ? "" : " and LM head", " resized from ",
                          m.vocab_size, " to ", want, " rows",
                          m.vocab_size > want ? ""
                          : c.mean_resizing   ? " (new rows: the mean of the old, as transformers' mean_resizing)"
                                              : " (new rows: normal(0, initializer_range))"));
  }
  return r;
}

// What the result depends on: the config's tokenizer settings and the model's tokenizer files as they are now.
std::string resolve_key(const TrainConfig& c) {
  json k = {{"model", c.model.string()},
            {"prepared", c.dataset_prepared_path.string()},
            {"special", c.tokenizer_edits.special},
            {"tokens", c.tokenizer_edits.tokens},
            {"additional", c.tokenizer_edits.additional_special},
            {"has_additional", c.tokenizer_edits.has_additional},
            {"chat_template", c.tokenizer_edits.chat_template},
            {"lora", c.lora.enabled},
            {"modules_to_save", c.lora.modules_to_save},
            {"flags", {c.resize_to_32x, c.shrink_embeddings, c.mean_resizing, c.mistral_common}}};
  for (const auto& [id, s] : c.tokenizer_edits.overrides) k["overrides"][std::to_string(id)] = s;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "config.json", "tekken.json"}) {
    std::error_code ec;
    const fs::path p = model_folder(c) / f;
    const auto size = fs::file_size(p, ec);
    k["files"].push_back(ec ? -1 : int64_t(size));
    k["times"].push_back(ec ? 0 : int64_t(fs::last_write_time(p, ec).time_since_epoch().count()));
  }
  return k.dump();
}

}  // namespace

const RunTokenizer& resolve_run_tokenizer(const TrainConfig& c) {
  static std::mutex mu;
  static std::map<std::string, RunTokenizer> done;
  const std::string key = resolve_key(c);
  const std::lock_guard<std::mutex> hold(mu);
  // (an edited copy removed since, as with dataset_prepared_path between runs of one process, is written again)
  if (const auto it = done.find(key); it != done.end()) {
    if (fs::exists(it->second.folder / "tokenizer.json") || it->second.folder == model_folder(c)) return it->second;
    done.erase(it);
  }
  return done.emplace(key, resolve(c)).first->second;
}

fs::path run_tokenizer_folder(const TrainConfig& c) {
  return resolve_run_tokenizer(c).folder;
}

std::optional<VocabResize> run_vocab_resize(const TrainConfig& c) {
  const int rows = resolve_run_tokenizer(c).vocab_resize;
  if (rows == 0) return std::nullopt;
  return VocabResize{rows, c.mean_resizing};
}

void prepare_run_tokenizer(TrainConfig& c) {
  const RunTokenizer& r = resolve_run_tokenizer(c);
  c.notes.insert(c.notes.end(), r.notes.begin(), r.notes.end());
}

}  // namespace soltrain
