// Loading tokenizer.json and the encode pipeline: added tokens → normalizer → pre-tokenizer → BPE.
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "io/json_file.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/tekken.h"
#include "tokenizer/utf8.h"

namespace soltrain {

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path)) {
    file = path / "tokenizer.json";
    // (a Mistral repository may hold only mistral-common's tekken.json: read as transformers converts it)
    if (!std::filesystem::exists(file) && std::filesystem::exists(path / "tekken.json"))
      return from_json(convert_tekken(path / "tekken.json").tokenizer, (path / "tekken.json").string());
    if (!std::filesystem::exists(file)) user_error(path.string(), ": folder has no tokenizer.json or tekken.json");
  }
  return from_json(read_json_file(file), file.string());
}

Tokenizer Tokenizer::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) user_error(where, ": expected a JSON object at the top level");
  Tokenizer t;
  t.where_ = where;
  const auto model = json_req<nlohmann::json>(j, "model", where);
  const std::string type =
      json_or<std::string>(model, "type", model.contains("merges") ? "BPE" : "", where + ": model");
  if (type != "BPE") user_error(where, ": model type '", type, "' is not supported (only BPE)");
  t.model_ = std::make_unique<Bpe>(model, where);
  t.normalizer_ = make_normalizer(j.value("normalizer", nlohmann::json()), where);
  t.pre_tokenizer_ = make_pre_tokenizer(j.value("pre_tokenizer", nlohmann::json()), where);
  t.decoder_ = make_decoder(j.value("decoder", nlohmann::json()), where);
  try {
    t.read_post_processor(j.value("post_processor", nlohmann::json()));
  } catch (const nlohmann::json::exception& e) {  // a wrong type or shape deep inside it
    user_error(where, ": post_processor: ", e.what());
  }

  const auto added = json_or<nlohmann::json>(j, "added_tokens", nlohmann::json::array(), where);
  if (!added.is_array()) user_error(where, ": 'added_tokens' must be a list");
  // Ids index a table: real tokenizers number their tokens densely (added ones just past the vocabulary), so an
  // id far past the count of tokens is refused rather than allocated for (a fuzzed id of 2^31 asked 68 GB).
  const size_t id_limit = t.model_->vocab().size() + added.size() + (size_t(1) << 20);
  auto check_id = [&](int64_t id, const std::string& w) {
    if (id >= 0 && size_t(id) >= id_limit)
      user_error(w, ": id ", id, " is far past the ", t.model_->vocab().size() + added.size(),
                 " tokens (ids are numbered densely)");
  };
  for (const auto& [token, id] : t.model_->vocab()) {
    check_id(id, where + ": model.vocab");
    if (size_t(id) >= t.id_to_token_.size()) t.id_to_token_.resize(size_t(id) + 1);
    t.id_to_token_[size_t(id)] = token;
  }
  for (const auto& a : added) {
    const std::string w = where + ": added_tokens";
    AddedToken tok;
    const int64_t id = json_req<int64_t>(a, "id", w);
    if (id < 0 || id > INT32_MAX) user_error(w, ": id ", id, " is out of range");
    check_id(id, w);
    tok.id = int32_t(id);
    tok.content = json_req<std::string>(a, "content", w);
    tok.single_word = json_or<bool>(a, "single_word", false, w);
    tok.lstrip = json_or<bool>(a, "lstrip", false, w);
    tok.rstrip = json_or<bool>(a, "rstrip", false, w);
    tok.special = json_or<bool>(a, "special", false, w);
    tok.normalized = json_or<bool>(a, "normalized", !tok.special, w);
    if (!utf8_valid(tok.content)) user_error(w, ": content of id ", id, " is not valid UTF-8");
    t.added_by_id_[tok.id] = t.added_.size();
    t.added_.push_back(tok);
    if (size_t(tok.id) >= t.id_to_token_.size()) t.id_to_token_.resize(size_t(tok.id) + 1);
    t.id_to_token_[size_t(tok.id)] = tok.content;
  }
  // Match order follows the added_tokens list, so on equal content the first entry wins.
  for (const AddedToken& tok : t.added_) {
    if (tok.normalized && t.normalizer_) {
      std::string pattern = tok.content;
      t.normalizer_->normalize(pattern);
      t.norm_matcher_.add(tok, std::move(pattern));
    } else if (tok.normalized) {
      t.norm_matcher_.add(tok, tok.content);
    } else {
      t.raw_matcher_.add(tok, tok.content);
    }
  }
  return t;
}

void Tokenizer::read_post_processor(const nlohmann::json& p) {
  if (p.is_null()) return;
  const std::string w = where_ + ": post_processor";
  const std::string type = json_req<std::string>(p, "type", w);
  if (type == "Sequence") {  // e.g. ByteLevel (offsets only) then TemplateProcessing (the specials)
    for (const nlohmann::json& q : json_req<nlohmann::json>(p, "processors", w)) read_post_processor(q);
  } else if (type == "TemplateProcessing") {
    // "single": [{"SpecialToken": {"id": "<|begin_of_text|>"}}, {"Sequence": {"id": "A"}}, ...]; the special
    // tokens' ids are in "special_tokens": {"<|begin_of_text|>": {"ids": [128000]}}.
    const auto specials = json_req<nlohmann::json>(p, "special_tokens", w);
    bool after = false;
    for (const nlohmann::json& item : json_req<nlohmann::json>(p, "single", w)) {
      if (item.contains("Sequence")) {
        after = true;
        continue;
      }
      const std::string id = json_req<std::string>(json_req<nlohmann::json>(item, "SpecialToken", w), "id", w);
      const auto s = specials.find(id);
      if (s == specials.end()) user_error(w, ": special token '", id, "' of the template is not in special_tokens");
      for (const nlohmann::json& v : json_req<nlohmann::json>(*s, "ids", w)) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
          user_error(w, ": special token '", id, "' has an id that is not a token id (", v.dump(), ")");
        (after ? special_suffix_ : special_prefix_).push_back(v.get<int32_t>());
      }
    }
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {  // [cls] text [sep]
    special_prefix_.push_back(json_req<nlohmann::json>(p, "cls", w).at(1).get<int32_t>());
    special_suffix_.push_back(json_req<nlohmann::json>(p, "sep", w).at(1).get<int32_t>());
  } else if (type != "ByteLevel") {  // ByteLevel only adjusts offsets
    unread_post_processor_ = type;
  }
}

std::vector<int32_t> Tokenizer::encode_with_special_tokens(std::string_view text) {
  if (!unread_post_processor_.empty())
    user_error(where_, ": post_processor type '", unread_post_processor_,
               "' is not supported (the special tokens it adds are unknown)");
  std::vector<int32_t> out = special_prefix_;
  const std::vector<int32_t> ids = encode(text);
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), special_suffix_.begin(), special_suffix_.end());
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) {
  if (!utf8_valid(text)) user_error("text to encode is not valid UTF-8");
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  for (const TextPart& part : raw_matcher_.split(text)) {
    if (part.id >= 0)
      out.push_back(part.id);
    else
      encode_text(part.text, part.offset == 0, out);
  }
  return out;
}

// Normalizes one stretch of text between raw added tokens, then matches the normalized added tokens
// and pre-tokenizes and BPE-encodes what lies between them.
void Tokenizer::encode_text(std::string_view raw, bool at_start, std::vector<int32_t>& out) {
  std::string normalized(raw);
  if (normalizer_) normalizer_->normalize(normalized);
  for (const TextPart& part : norm_matcher_.split(normalized)) {
    if (part.id >= 0) {
      out.push_back(part.id);
      continue;
    }
    thread_local std::vector<Piece> pieces;  // scratch reused between calls, one per thread
    pieces.clear();
    pieces.push_back({std::string(part.text), at_start && part.offset == 0});
    if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
    for (const Piece& p : pieces) model_->encode_word(p.text, out);
  }
}

size_t Tokenizer::model_vocab_size() const {
  return model_->vocab().size();
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : added_)
    if (a.content == token) return a.id;
  return model_->token_to_id(token);
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_token_.size())
    user_error(where_, ": token id ", id, " is outside the vocabulary (size ", id_to_token_.size(), ")");
  return id_to_token_[size_t(id)];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (skip_special_tokens) {
      const auto it = added_by_id_.find(id);
      if (it != added_by_id_.end() && added_[it->second].special) continue;
    }
    tokens.push_back(id_to_token(id));
  }
  if (!decoder_) {
    // HF joins the tokens with spaces when there is no decoder.
    std::string s;
    for (size_t i = 0; i < tokens.size(); ++i) s += (i ? " " : "") + tokens[i];
    return s;
  }
  decoder_->decode(tokens);
  std::string s;
  for (const std::string& t : tokens) s += t;
  return s;
}

}  // namespace soltrain
