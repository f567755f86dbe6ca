// PCRE2 wrapper. HF compiles its patterns with Oniguruma; PCRE2 with UTF|UCP agrees on the patterns
// tokenizers ship (\p{L}, \p{N}, \s, lookahead, (?i:...)), which the fixture tests check.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"

namespace soltrain {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  pcre2_match_data* data = nullptr;
  ~Impl() {
    pcre2_match_data_free(data);
    pcre2_code_free(code);
  }
};

Regex::Regex(const std::string& pattern, const std::string& where) : impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                              &offset, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    user_error(where, ": regex '", pattern, "' does not compile at offset ", offset, ": ",
               reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
  impl_->data = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
  std::vector<std::pair<size_t, size_t>> out;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t start = 0;
  while (start <= s.size()) {
    // The input is validated once up front, so PCRE2 need not re-check UTF-8 on every call.
    const int rc = pcre2_match(impl_->code, subject, s.size(), start, PCRE2_NO_UTF_CHECK, impl_->data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw std::runtime_error(cat("regex match failed: ", reinterpret_cast<const char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(impl_->data);
    const size_t b = ov[0], e = ov[1];
    out.emplace_back(b, e);
    if (e > b) {
      start = e;
    } else {
      // An empty match: step over one character, as Oniguruma's iterator does.
      if (e >= s.size()) break;
      start = e + 1;
      while (start < s.size() && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) ++start;
    }
  }
  return out;
}

std::string regex_escape(std::string_view literal) {
  // \Q...\E quotes everything except a literal "\E", which we split around.
  std::string out = "\\Q";
  for (size_t i = 0; i < literal.size(); ++i) {
    if (literal.compare(i, 2, "\\E") == 0) {
      out += "\\E\\\\E\\Q";
      ++i;
    } else {
      out += literal[i];
    }
  }
  out += "\\E";
  return out;
}

}  // namespace soltrain
