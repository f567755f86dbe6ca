// Axolotl's tokenizer settings applied to a model's tokenizer files, as transformers applies them and saves the
// result (tokenizer.json's added_tokens, tokenizer_config.json's special-token keys and added_tokens_decoder):
// `added_tokens_overrides` (renaming reserved added tokens), then `special_tokens` (each sets that role and adds
// its token when new), `tokens` (plain added tokens), `special_tokens.additional_special_tokens`, in Axolotl's
// order (loaders/tokenizer.py), so new tokens get the ids HF tokenizers gives them.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace soltrain {

struct TokenizerEdits {
  std::map<int32_t, std::string> overrides;                  // added_tokens_overrides: id -> new content
  std::vector<std::pair<std::string, std::string>> special;  // special_tokens in the file's order (role, token)
  std::vector<std::string> additional_special;               // special_tokens.additional_special_tokens
  bool has_additional = false;                               // (given, possibly empty: it replaces the list)
  std::vector<std::string> tokens;                           // tokens
  std::string chat_template;  // Axolotl's chat_template: jinja's chat_template_jinja: tokenizer_config's template
  bool empty() const {
    return overrides.empty() && special.empty() && !has_additional && tokens.empty() && chat_template.empty();
  }
};

// A special-token value of tokenizer_config.json as transformers reads it: a string, or an AddedToken's fields
// ({"content": ...}); "" otherwise.
std::string special_token_text(const nlohmann::json& value);

struct EditedTokenizer {
  nlohmann::json tokenizer;                            // tokenizer.json
  nlohmann::json config;                               // tokenizer_config.json
  std::vector<std::pair<std::string, int32_t>> added;  // tokens new to the vocabulary, with their ids
  int64_t length = 0;              // transformers' len(tokenizer): distinct token strings, added ones included
  std::vector<std::string> notes;  // what the run should say (a BOS change the post_processor does not follow)
};

// The edited files. Ids as HF tokenizers' AddedVocabulary assigns them: a token already in the model's vocabulary
// keeps its id (and is matched whole from then on), one already added is left as it is (flags too), a new one takes the
// next id past both the model's vocabulary and the added tokens. A new bos_token leaves a post_processor that puts the
// old one before every text as it is, as transformers 5 does (noted). A role other than bos/eos/unk/pad/sep/cls/mask
// or an override of an id that is no added token: UserError.
EditedTokenizer edit_tokenizer(const nlohmann::json& tokenizer_json, const nlohmann::json& tokenizer_config,
                               const TokenizerEdits& edits, const std::string& where);

}  // namespace soltrain
