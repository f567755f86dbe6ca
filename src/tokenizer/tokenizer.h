// A Hugging Face tokenizer.json (BPE model) that encodes text to the same ids as HF tokenizers.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"

namespace soltrain {

// encode() may be called from several threads at once (word caches and scratch are per thread).
class Tokenizer {
 public:
  // `path` is a tokenizer.json or a folder holding one. Bad or unsupported content throws UserError.
  static Tokenizer load(const std::filesystem::path& path);
  // `where` names the source in error messages.
  static Tokenizer from_json(const nlohmann::json& j, const std::string& where = "tokenizer.json");

  // HF's Tokenizer.encode(text, add_special_tokens=False): added tokens in the text are still matched,
  // but no BOS/EOS or template is added (the post_processor is not applied). text must be UTF-8.
  std::vector<int32_t> encode(std::string_view text);

  // HF's Tokenizer.encode(text, add_special_tokens=True) for one sequence: encode() inside the ids the
  // post_processor puts around a single sequence (Llama 3.1's TemplateProcessing: <|begin_of_text|> first;
  // Qwen's ByteLevel: nothing). What transformers' tokenizer(text) gives, and so what Axolotl trains on for
  // text and alpaca prompts. A post_processor of a kind soltrain does not read throws UserError here.
  std::vector<int32_t> encode_with_special_tokens(std::string_view text);
  // The ids encode_with_special_tokens adds before and after the text.
  const std::vector<int32_t>& special_prefix() const { return special_prefix_; }
  const std::vector<int32_t>& special_suffix() const { return special_suffix_; }

  // HF's Tokenizer.decode(ids, skip_special_tokens). An id outside the vocabulary throws UserError.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token string of id (added-token content or the model's vocab entry); throws if unknown.
  const std::string& id_to_token(int32_t id) const;
  // One past the largest id of the model vocab and the added tokens.
  size_t vocab_size() const { return id_to_token_.size(); }
  // The model's own vocabulary (tokenizers' model.get_vocab_size()): where new added tokens' ids start.
  size_t model_vocab_size() const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  Tokenizer() = default;
  void encode_text(std::string_view raw, bool at_start, std::vector<int32_t>& out);

  std::string where_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<Bpe> model_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;  // id -> index into added_
  AddedTokenMatcher raw_matcher_;                    // added tokens with normalized=false, matched in the raw text
  AddedTokenMatcher norm_matcher_;                   // normalized=true ones, matched after normalization
  std::vector<std::string> id_to_token_;
  std::vector<int32_t> special_prefix_, special_suffix_;  // from the post_processor's single-sequence template
  std::string unread_post_processor_;                     // its type, when it is one soltrain does not read
  void read_post_processor(const nlohmann::json& p);
};

}  // namespace soltrain
