// Added-token matching with HF's rules (added_vocabulary.rs find_matches).
#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace soltrain {

int32_t AddedTokenMatcher::child(int32_t node, unsigned char c) const {
  const auto& next = nodes_[size_t(node)].next;
  const auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, int32_t(-1)));
  return it != next.end() && it->first == c ? it->second : -1;
}

void AddedTokenMatcher::add(const AddedToken& token, std::string pattern) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (unsigned char c : pattern) {
    int32_t nx = child(node, c);
    if (nx < 0) {
      nx = int32_t(nodes_.size());
      auto& next = nodes_[size_t(node)].next;
      next.insert(std::lower_bound(next.begin(), next.end(), std::make_pair(c, int32_t(-1))), {c, nx});
      nodes_.emplace_back();
    }
    if (node == 0) root_[c] = nx;
    node = nx;
  }
  // The first token with a given pattern keeps it, as in HF.
  if (nodes_[size_t(node)].token < 0) {
    nodes_[size_t(node)].token = int32_t(tokens_.size());
    tokens_.push_back(token);
  }
}

namespace {

// The code point just before byte offset `end` (s[..end] must be valid UTF-8 and non-empty).
char32_t last_char(std::string_view s, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return utf8_next(s, b);
}

}  // namespace

std::vector<TextPart> AddedTokenMatcher::split(std::string_view s) const {
  std::vector<TextPart> parts;
  if (tokens_.empty()) {
    if (!s.empty()) parts.push_back({s, -1, 0});
    return parts;
  }
  size_t done = 0;  // end of the last emitted part
  size_t pos = 0;
  while (pos < s.size()) {
    // Longest pattern starting at pos; `node` spells s[pos, k).
    int32_t node = root_[static_cast<unsigned char>(s[pos])], found = -1;
    size_t found_end = 0;
    for (size_t k = pos + 1; node > 0; ++k) {
      if (nodes_[size_t(node)].token >= 0) {
        found = nodes_[size_t(node)].token;
        found_end = k;
      }
      if (k >= s.size()) break;
      node = child(node, static_cast<unsigned char>(s[k]));
    }
    if (found < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = tokens_[size_t(found)];
    size_t start = pos, stop = found_end;
    pos = found_end;  // the search resumes after the match even if the match is discarded below
    if (t.single_word) {
      size_t i = stop;
      const bool word_before = start > 0 && is_unicode_alphanumeric(last_char(s, start));
      const bool word_after = stop < s.size() && is_unicode_alphanumeric(utf8_next(s, i));
      if (word_before || word_after) continue;
    }
    if (t.lstrip) {
      size_t b = start;
      while (b > done && is_unicode_whitespace(last_char(s, b))) {
        --b;
        while ((static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
      }
      start = b;
    }
    if (t.rstrip) {
      size_t e = stop;
      while (e < s.size()) {
        size_t i = e;
        if (!is_unicode_whitespace(utf8_next(s, i))) break;
        e = i;
      }
      stop = e;
      // HF resumes its search inside the stripped spaces, which can yield overlapping parts; we skip them.
      pos = std::max(pos, stop);
    }
    if (start > done) parts.push_back({s.substr(done, start - done), -1, done});
    parts.push_back({s.substr(start, stop - start), t.id, start});
    done = stop;
  }
  if (done < s.size()) parts.push_back({s.substr(done), -1, done});
  return parts;
}

}  // namespace soltrain
