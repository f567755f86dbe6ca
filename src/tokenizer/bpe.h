// The BPE model of tokenizer.json: vocab + ranked merges, applied to one pre-tokenized word at a time.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace soltrain {

// Hash for string keys that also accepts string_view lookups without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  // Reads model{type: BPE, vocab, merges, ...}; throws UserError naming `where` on anything malformed.
  Bpe(const nlohmann::json& model, const std::string& where);

  // Appends the ids of `word` to out. Results are cached per word in a cache of the calling thread, so one
  // Bpe serves many threads.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  const TokenMap& vocab() const { return vocab_; }
  std::optional<int32_t> token_to_id(std::string_view token) const;

 private:
  std::vector<int32_t> merge_word(std::string_view word) const;

  struct Merge {
    int32_t rank, id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  TokenMap vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  std::string prefix_, suffix_;  // continuing_subword_prefix / end_of_word_suffix
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  uint64_t id_;  // distinguishes this Bpe's entries in the per-thread caches (addresses can be reused)
};

}  // namespace soltrain
