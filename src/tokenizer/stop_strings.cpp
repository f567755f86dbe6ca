#include "tokenizer/stop_strings.h"

#include <algorithm>

#include "core/error.h"

namespace soltrain {

StopStrings::StopStrings(const Tokenizer& tokenizer, std::vector<std::string> strings, const std::string& what)
    : tokenizer_(tokenizer), strings_(std::move(strings)) {
  size_t longest = 0;
  for (const std::string& s : strings_) {
    if (s.empty()) user_error(what, ": an empty stop string would end every completion at its first token");
    longest = std::max(longest, s.size());
  }
  // Every token decodes to at least one byte, so this many tokens before the last hold the longest string whole;
  // one more keeps a decoder's handling of a window's first token (a stripped leading space) away from it.
  window_ = longest + 2;
}

std::function<bool(std::span<const int32_t>)> StopStrings::stop_after() const {
  if (strings_.empty()) return {};
  return [this](std::span<const int32_t> row) { return completed_by_last(row); };
}

bool StopStrings::completed_by_last(std::span<const int32_t> generated) const {
  if (strings_.empty() || generated.empty()) return false;
  // (ids past the tokenizer's vocabulary, a model's padding rows, add no text)
  std::vector<int32_t> w;
  for (size_t i = generated.size() - std::min(generated.size(), window_); i < generated.size(); ++i)
    if (generated[i] >= 0 && size_t(generated[i]) < tokenizer_.vocab_size()) w.push_back(generated[i]);
  if (w.empty() || w.back() != generated.back()) return false;
  const std::string before = tokenizer_.decode(std::span(w).first(w.size() - 1)), now = tokenizer_.decode(w);
  // Where the last token's text begins: the end of what `before` and `now` share (the last token may also
  // complete a multi-byte character `before` ended inside of).
  const size_t fresh =
      size_t(std::mismatch(before.begin(), before.end(), now.begin(), now.end()).first - before.begin());
  for (const std::string& s : strings_) {
    // an occurrence ending after `fresh`: it starts after fresh - |s|
    const size_t from = fresh >= s.size() ? fresh - s.size() + 1 : 0;
    if (now.find(s, from) != std::string::npos) return true;
  }
  return false;
}

}  // namespace soltrain
