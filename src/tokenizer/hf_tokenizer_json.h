// Pieces of a Hugging Face tokenizer.json that soltrain writes (the demo's byte tokenizer, a tekken.json
// converted), with every field HF tokenizers' own serialisation has: its loader rejects a ByteLevel or BPE without
// them ("data did not match any variant of untagged enum ...").
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace soltrain {

// An added special token (matched whole in the raw text, never normalized).
inline nlohmann::json hf_added_special_token(int64_t id, const std::string& content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

// A ByteLevel pre-tokenizer, post-processor or decoder.
inline nlohmann::json hf_byte_level(bool add_prefix_space, bool trim_offsets, bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", trim_offsets},
          {"use_regex", use_regex}};
}

// A byte-level BPE model over `vocab` (token -> id) and `merges` ([[left, right], ...] by priority).
inline nlohmann::json hf_bpe_model(nlohmann::json vocab, nlohmann::json merges, bool ignore_merges) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", ignore_merges},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

}  // namespace soltrain
