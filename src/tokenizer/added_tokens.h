// tokenizer.json "added_tokens": strings matched in the raw text before normalization and BPE.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace soltrain {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// A part of the input: either an added token (id >= 0) or text still to be tokenized (id == -1).
struct TextPart {
  std::string_view text;
  int32_t id = -1;
  size_t offset = 0;  // where the part starts in the string given to split()
};

// Finds added tokens leftmost-longest with a byte trie, as HF's Aho-Corasick (LeftmostLongest) does.
class AddedTokenMatcher {
 public:
  // `patterns` are the strings to look for (the token content, or its normalized form).
  void add(const AddedToken& token, std::string pattern);
  bool empty() const { return tokens_.empty(); }

  // Splits s into added tokens and the text between them, honouring single_word, lstrip and rstrip.
  std::vector<TextPart> split(std::string_view s) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;  // sorted by byte
    int32_t token = -1;                                   // index into tokens_ if a pattern ends here
  };
  int32_t child(int32_t node, unsigned char c) const;
  std::vector<Node> nodes_{Node{}};
  std::array<int32_t, 256> root_{};  // child of the root per first byte (0 = none): most bytes start no token
  std::vector<AddedToken> tokens_;
};

}  // namespace soltrain
