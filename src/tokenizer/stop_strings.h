// Stop strings (TRL's generation_kwargs `stop` / `stop_strings`, vLLM's `stop`, transformers' StopStringCriteria):
// generation of a row ends at the token that completes one of them in the generated text. The text is the
// tokenizer's decoding, so a stop string may span tokens or end inside one ("st" + "opper" completes "stop");
// as in transformers, the token that completes it is kept, and so is any text after it within that token.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace soltrain {

class StopStrings {
 public:
  // `strings` non-empty each (an empty one is refused in one line naming `what`, the setting it came from).
  StopStrings(const Tokenizer& tokenizer, std::vector<std::string> strings, const std::string& what = "stop strings");
  // Whether the last of `generated` completes a stop string: one occurs in the decoded text and ends inside the
  // text the last token added (an earlier occurrence would have ended the row before). Reads a window of the last
  // few tokens, not the whole row.
  bool completed_by_last(std::span<const int32_t> generated) const;
  const std::vector<std::string>& strings() const { return strings_; }
  // completed_by_last as GenerationOptions::stop_after takes it (empty without strings); reads this object, which
  // must outlive the generation.
  std::function<bool(std::span<const int32_t>)> stop_after() const;

 private:
  const Tokenizer& tokenizer_;
  std::vector<std::string> strings_;
  size_t window_ = 0;  // tokens decoded per check: more than the longest string's bytes
};

}  // namespace soltrain
