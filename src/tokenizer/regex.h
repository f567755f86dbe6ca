// A compiled PCRE2 pattern (UTF + Unicode properties, JIT) that lists the spans it matches in a string.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace soltrain {

class Regex {
 public:
  // Throws UserError naming `where` if the pattern does not compile.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Non-overlapping matches left to right, as [begin, end) byte offsets; s must be valid UTF-8.
  // Safe to call from several threads at once.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A regex that matches `literal` verbatim (HF's String patterns).
std::string regex_escape(std::string_view literal);

}  // namespace soltrain
