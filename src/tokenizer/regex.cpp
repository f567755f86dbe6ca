// PCRE2 wrapper. HF compiles its patterns with Oniguruma; PCRE2 with UTF|UCP agrees on the patterns
// tokenizers ship (\p{L}, \p{N}, \s, lookahead, (?i:...)), which the fixture tests check.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"

namespace soltrain {

namespace {

// Oniguruma's Unicode \s: TAB..CR, NEL and the Zs/Zl/Zp characters. PCRE2's \s also matches U+180E
// (Mongolian vowel separator, no longer a space since Unicode 6.3), so we spell the class out.
constexpr const char* kOnigSpace =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Rewrites \s (and \S outside classes) to Oniguruma's meaning; \Q...\E and other escapes are copied as is.
std::string onig_compatible(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 'Q') {  // quoted literal up to \E
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == std::string::npos ? p.size() : end + 2;
        out.append(p, i, stop - i);
        i = stop - 1;
      } else if (e == 's') {
        out += in_class ? kOnigSpace : cat("[", kOnigSpace, "]");
        ++i;
      } else if (e == 'S' && !in_class) {  // inside a class \S is left to PCRE2 (rare in tokenizers)
        out += cat("[^", kOnigSpace, "]");
        ++i;
      } else {
        out += c;
        out += e;
        ++i;
      }
    } else if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
    } else if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t end = p.find(":]", i + 2);
      const size_t stop = end == std::string::npos ? p.size() : end + 2;
      out.append(p, i, stop - i);
      i = stop - 1;
    } else {
      if (in_class && c == ']') in_class = false;
      out += c;
    }
  }
  return out;
}

}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

namespace {
// Match data per call keeps find_all() safe to call from many threads on one Regex (one small
// allocation per piece of text, not per word).
struct MatchData {
  pcre2_match_data* data;
  explicit MatchData(const pcre2_code* code) : data(pcre2_match_data_create_from_pattern(code, nullptr)) {
    if (!data) throw std::bad_alloc();
  }
  ~MatchData() { pcre2_match_data_free(data); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
};
}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) : impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  const std::string onig = onig_compatible(pattern);
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(onig.data()), onig.size(), PCRE2_UTF | PCRE2_UCP, &err,
                              &offset, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    user_error(where, ": regex '", pattern, "' does not compile (as '", onig, "', at offset ", offset,
               "): ", reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
  std::vector<std::pair<size_t, size_t>> out;
  const MatchData md(impl_->code);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t start = 0;
  while (start <= s.size()) {
    // The input is validated once up front, so PCRE2 need not re-check UTF-8 on every call.
    const int rc = pcre2_match(impl_->code, subject, s.size(), start, PCRE2_NO_UTF_CHECK, md.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw std::runtime_error(cat("regex match failed: ", reinterpret_cast<const char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.data);
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
