// Tokenized shards on disk: per shard `<name>.tokens` (int32), `<name>.mask` (uint8, 1 = trained) and
// `<name>.docs` (int64 document start offsets into the shard plus the end), all little-endian, and a
// manifest.json naming them, with what produced them (inputs, settings, tokenizer) for reuse checks.
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/sample_encoder.h"

namespace soltrain {

inline constexpr int kShardFormatVersion = 1;

struct ShardInfo {
  std::string name;  // file stem inside the folder
  int64_t tokens = 0, documents = 0;
};

// Appends documents to shards of at most `max_tokens` tokens (a document is never split) in `dir`.
class ShardWriter {
 public:
  explicit ShardWriter(std::filesystem::path dir, int64_t max_tokens = int64_t(1) << 26);
  void add(const Document& d);
  std::vector<ShardInfo> finish();  // flushes the open shard

 private:
  void flush();
  std::filesystem::path dir_;
  int64_t max_tokens_;
  std::vector<int32_t> tokens_;
  std::vector<uint8_t> mask_;
  std::vector<int64_t> docs_{0};
  std::vector<ShardInfo> shards_;
};

// Every shard of a folder, concatenated in memory: document d is tokens[doc_offsets[d], doc_offsets[d+1]).
struct ShardSet {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  std::vector<int64_t> doc_offsets{0};
  // A token classifier's data (stepwise_supervised: manifest.json's token_labels): a mask byte is 0 or the token's
  // own label + 1, the target at that token; otherwise 1 marks a token the model is trained to predict.
  bool token_labels = false;
  int64_t documents() const { return int64_t(doc_offsets.size()) - 1; }
};

// The target of token k of the document starting at `begin` with `len` tokens kept: the next token where that one
// is trained, or (token_labels) the token's own label; -100 where there is none.
inline int32_t target_of(const ShardSet& s, int64_t begin, int k, int len) {
  if (s.token_labels) {
    const uint8_t m = s.mask[size_t(begin + k)];
    return m ? int32_t(m) - 1 : -100;
  }
  return k + 1 < len && s.mask[size_t(begin + k + 1)] ? s.tokens[size_t(begin + k + 1)] : -100;
}
// The largest label in token_labels data (-1: none).
int max_token_label(const ShardSet& s);

// The part of manifest.json every writer shares and load_shards / shards_match read: format, version, the
// reuse key and the shard list. Writers add their own counts (documents, tokens, ...) to it.
nlohmann::json shard_manifest(const nlohmann::json& key, const std::vector<ShardInfo>& shards);

// Reads manifest.json and its shards; UserError naming the file when one is missing or inconsistent.
ShardSet load_shards(const std::filesystem::path& dir);

// True when `dir` holds a manifest whose "key" equals `key` and whose shard files are all present with
// the sizes the manifest gives.
bool shards_match(const std::filesystem::path& dir, const nlohmann::json& key);

}  // namespace soltrain
