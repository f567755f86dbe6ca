#include "tokenizer/tekken.h"

#include <algorithm>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "io/base64.h"
#include "io/json_file.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/hf_tokenizer_json.h"

namespace soltrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The control tokens of a tekken.json of the first layout (no "special_tokens" list: Mistral NeMo's), in rank
// order, as mistral-common's Tekkenizer.DEPRECATED_SPECIAL_TOKENS lists them; the rest up to
// default_num_special_tokens are fillers "<SPECIAL_{rank}>".
const char* const kFirstLayoutSpecials[] = {"<unk>",
                                            "<s>",
                                            "</s>",
                                            "[INST]",
                                            "[/INST]",
                                            "[AVAILABLE_TOOLS]",
                                            "[/AVAILABLE_TOOLS]",
                                            "[TOOL_RESULTS]",
                                            "[/TOOL_RESULTS]",
                                            "[TOOL_CALLS]",
                                            "[IMG]",
                                            "<pad>",
                                            "[IMG_BREAK]",
                                            "[IMG_END]",
                                            "[PREFIX]",
                                            "[MIDDLE]",
                                            "[SUFFIX]",
                                            "[SYSTEM_PROMPT]",
                                            "[/SYSTEM_PROMPT]",
                                            "[TOOL_CONTENT]"};

std::vector<std::string> special_strings(const json& raw, size_t num_special, const std::string& where) {
  std::vector<std::string> out;
  if (!raw.contains("special_tokens")) {
    out.assign(std::begin(kFirstLayoutSpecials), std::end(kFirstLayoutSpecials));
  } else {
    const json& list = raw.at("special_tokens");
    if (!list.is_array()) user_error(where, ": special_tokens is not a list");
    std::vector<std::pair<int64_t, std::string>> ranked;
    for (const json& e : list) {
      if (!e.is_object() || !e.contains("rank") || !e.contains("token_str") || !e["rank"].is_number_integer() ||
          !e["token_str"].is_string())
        user_error(where, ": a special_tokens entry is not {rank, token_str}");
      ranked.emplace_back(e["rank"].get<int64_t>(), e["token_str"].get<std::string>());
    }
    std::sort(ranked.begin(), ranked.end());
    for (size_t i = 0; i < ranked.size(); ++i) {
      // (ids are the list's order, so the ranks must be 0, 1, 2, ... as transformers' converter requires)
      if (ranked[i].first != int64_t(i)) user_error(where, ": special_tokens ranks are not 0, 1, 2, ...");
      out.push_back(ranked[i].second);
    }
  }
  if (out.size() > num_special)
    user_error(where, ": ", out.size(), " special tokens but default_num_special_tokens is ", num_special);
  for (size_t i = out.size(); i < num_special; ++i) out.push_back("<SPECIAL_" + std::to_string(i) + ">");
  return out;
}

// Text of a message's content: a string, or chunks joined as mistral-common joins them (consecutive text chunks
// with a blank line between; a thinking chunk as [THINK]...[/THINK], only in v13 and later). An assistant's text
// loses its trailing spaces, as mistral-common encodes a string (text-only chunks are joined into one first);
// content with a thinking chunk is encoded chunk by chunk, nothing stripped.
const char* kContentMacro = R"J(
{%- macro content_of(message) -%}
  {%- set strip = message['role'] == 'assistant' -%}
  {%- if message['content'] is string -%}
    {{- message['content'].rstrip(' ') if strip else message['content'] -}}
  {%- else -%}
    {%- set ns = namespace(after_text=false, text='', thinking=false) -%}
    {%- for chunk in message['content'] -%}
      {%- if chunk['type'] == 'thinking' -%}{%- set ns.thinking = true -%}{%- endif -%}
    {%- endfor -%}
    {%- for chunk in message['content'] -%}
      {%- if chunk['type'] == 'text' -%}
        {%- set ns.text = ns.text + ('\n\n' if ns.after_text else '') + chunk['text'] -%}
        {%- set ns.after_text = true -%}
      {%- elif chunk['type'] == 'thinking' and @THINKING@ -%}
        {%- set ns.text = ns.text + '[THINK]' + chunk['thinking'] + '[/THINK]' -%}
        {%- set ns.after_text = false -%}
      {%- else -%}
        {{- raise_exception('mistral-common format @VERSION@: a ' + message['role'] + ' message has a chunk of type ' + (chunk['type'] | string) + ' (@CHUNKS@ only)') -}}
      {%- endif -%}
    {%- endfor -%}
    {{- ns.text.rstrip(' ') if strip and not ns.thinking else ns.text -}}
  {%- endif -%}
{%- endmacro -%}
)J";

// v3: no system turn; the system prompt is put before the last user message, a blank line between. (So a
// conversation's earlier turns with a system prompt do not render as a prefix of the whole, which the turns'
// masks are found by: a system prompt with several user messages is refused.)
const char* kV3 = R"J(
{%- set ns = namespace(system='', last_user=-1) -%}
{%- for message in messages -%}
  {%- if message['role'] == 'system' -%}
    {%- if not loop.first -%}{{- raise_exception('mistral-common format v3: a system message is only allowed first') -}}{%- endif -%}
    {%- set ns.system = content_of(message) -%}
  {%- elif message['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{%- if ns.system and (messages | selectattr('role', 'equalto', 'user') | list | length) > 1 -%}
  {{- raise_exception('mistral-common format v3 puts the system prompt before the last user message, so the earlier turns of a conversation with a system prompt and several user messages are not a prefix of it: such conversations are not built') -}}
{%- endif -%}
{{- bos_token -}}
{%- for message in messages -%}
  {%- if message['role'] == 'user' -%}
    {{- '[INST]' + (ns.system + '\n\n' if loop.index0 == ns.last_user and ns.system else '') + content_of(message) + '[/INST]' -}}
  {%- elif message['role'] == 'assistant' -%}{{- content_of(message) + eos_token -}}
  {%- elif message['role'] != 'system' -%}
    {{- raise_exception('mistral-common format v3: role ' + message['role'] + ' is not built (system, user, assistant)') -}}
  {%- endif -%}
{%- endfor -%}
)J";

// v7 and later: the system prompt in its own [SYSTEM_PROMPT] turn where it stands.
const char* kV7 = R"J(
{{- bos_token -}}
{%- for message in messages -%}
  {%- if message['role'] == 'system' -%}{{- '[SYSTEM_PROMPT]' + content_of(message) + '[/SYSTEM_PROMPT]' -}}
  {%- elif message['role'] == 'user' -%}{{- '[INST]' + content_of(message) + '[/INST]' -}}
  {%- elif message['role'] == 'assistant' -%}{{- content_of(message) + eos_token -}}
  {%- else -%}
    {{- raise_exception('mistral-common format @VERSION@: role ' + message['role'] + ' is not built (system, user, assistant)') -}}
  {%- endif -%}
{%- endfor -%}
)J";

// config's `key` as a count, or `fallback` when absent; a UserError naming the file when it is not one.
size_t config_count(const json& cfg, const char* key, size_t fallback, const std::string& where) {
  if (!cfg.contains(key)) return fallback;
  if (!cfg[key].is_number_unsigned()) user_error(where, ": config.", key, " is not a count");
  return cfg[key].get<size_t>();
}

}  // namespace

std::string mistral_chat_template(const std::string& version, const std::string& where) {
  // (v15 adds model settings before the first turn, which mistral-common writes only when a request sets them)
  static const std::vector<std::string> known = {"v3", "v7", "v11", "v13"};
  if (std::find(known.begin(), known.end(), version) == known.end())
    user_error(where, ": tekken version \"", version,
               "\": soltrain writes mistral-common's formats v3, v7, v11 and v13");
  const bool thinking = version == "v13";
  std::string t = std::string(kContentMacro) + (version == "v3" ? kV3 : kV7);
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"@VERSION@", version},
                                 {"@THINKING@", thinking ? "true" : "false"},
                                 {"@CHUNKS@", thinking ? "text and thinking" : "text"}})
    for (size_t at = t.find(from); at != std::string::npos; at = t.find(from, at + to.size()))
      t.replace(at, from.size(), to);
  return t;
}

TekkenConversion convert_tekken(const fs::path& tekken_json) {
  const std::string where = tekken_json.string();
  const json raw = read_json_file(tekken_json);
  if (!raw.is_object() || !raw.contains("config") || !raw.contains("vocab") || !raw["vocab"].is_array())
    user_error(where, ": not a tekken.json (config and vocab expected)");
  const json& cfg = raw["config"];
  if (!cfg.contains("pattern") || !cfg["pattern"].is_string()) user_error(where, ": config.pattern is missing");
  const json& vocab_raw = raw["vocab"];
  const size_t num_special = config_count(
      cfg, "default_num_special_tokens",
      raw.contains("special_tokens") ? raw["special_tokens"].size() : std::size(kFirstLayoutSpecials), where);
  const std::vector<std::string> specials = special_strings(raw, num_special, where);
  // mistral-common keeps the first default_vocab_size - num_special ranks (the file may list more)
  size_t inner = vocab_raw.size();
  if (cfg.contains("default_vocab_size")) {
    const size_t total = config_count(cfg, "default_vocab_size", 0, where);
    if (total < num_special) user_error(where, ": default_vocab_size is below the special tokens' count");
    inner = std::min(inner, total - num_special);
  }
  std::vector<std::string> tokens(inner);
  std::unordered_map<std::string, int64_t> rank_of;
  rank_of.reserve(inner * 2);
  for (size_t r = 0; r < inner; ++r) {
    const json& e = vocab_raw[r];
    if (!e.is_object() || !e.contains("token_bytes") || !e["token_bytes"].is_string())
      user_error(where, ": vocab entry ", r, " has no token_bytes");
    tokens[r] = base64_decode(e["token_bytes"].get<std::string>(), where + " vocab entry " + std::to_string(r));
    rank_of.emplace(tokens[r], int64_t(r));
  }
  // The merges a rank-ordered BPE implies (transformers' MistralConverter._extract_merges): for each token in rank
  // order, every split into two tokens of the vocabulary, ordered by the pieces' ranks.
  json vocab = json::object(), merges = json::array();
  for (size_t i = 0; i < specials.size(); ++i) vocab[specials[i]] = int64_t(i);
  std::vector<std::pair<std::pair<int64_t, int64_t>, size_t>> splits;
  for (size_t r = 0; r < inner; ++r) {
    const std::string& t = tokens[r];
    vocab[byte_level_encode(t)] = int64_t(r + num_special);
    splits.clear();
    for (size_t k = 1; k < t.size(); ++k) {
      const auto a = rank_of.find(t.substr(0, k)), b = rank_of.find(t.substr(k));
      if (a != rank_of.end() && b != rank_of.end()) splits.push_back({{a->second, b->second}, k});
    }
    std::sort(splits.begin(), splits.end());
    for (const auto& [ranks, k] : splits)
      merges.push_back(json::array({byte_level_encode(t.substr(0, k)), byte_level_encode(t.substr(k))}));
  }
  json added = json::array();
  for (size_t i = 0; i < specials.size(); ++i) added.push_back(hf_added_special_token(int64_t(i), specials[i]));
  TekkenConversion out;
  if (cfg.contains("version") && !cfg["version"].is_string()) user_error(where, ": config.version is not a string");
  out.version = cfg.value("version", std::string("v3"));
  out.tokenizer = {{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", added},
                   {"normalizer", nullptr},
                   {"pre_tokenizer",
                    {{"type", "Sequence"},
                     {"pretokenizers", json::array({{{"type", "Split"},
                                                     {"pattern", {{"Regex", cfg["pattern"]}}},
                                                     {"behavior", "Isolated"},
                                                     {"invert", false}},
                                                    hf_byte_level(false, true, false)})}}},
                   {"post_processor", hf_byte_level(true, false, true)},
                   {"decoder", hf_byte_level(true, true, true)},
                   {"model", hf_bpe_model(std::move(vocab), std::move(merges), /*ignore_merges=*/true)}};
  const auto has = [&](const char* s) { return std::find(specials.begin(), specials.end(), s) != specials.end(); };
  json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                 {"clean_up_tokenization_spaces", false},
                 {"chat_template", mistral_chat_template(out.version, where)}};
  for (const auto& [key, token] : {std::pair{"bos_token", "<s>"}, std::pair{"eos_token", "</s>"},
                                   std::pair{"unk_token", "<unk>"}, std::pair{"pad_token", "<pad>"}})
    if (has(token)) config[key] = token;
  if (!config.contains("bos_token") || !config.contains("eos_token"))
    user_error(where, ": the special tokens have no <s> and </s>");
  out.config = std::move(config);
  return out;
}

}  // namespace soltrain
