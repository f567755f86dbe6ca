// Template lexer: text/tag splitting with jinja2's whitespace rules, then expression tokens inside tags.
#include "tokenizer/jinja_lexer.h"

#include <algorithm>
#include <cstring>

#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_text.h"
#include "tokenizer/utf8.h"

namespace soltrain::jinja {
namespace {

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;  // jinja2 lets lstrip_blocks strip at the very start of the template
    while (pos < src_.size()) {
      size_t start = next_tag(pos);
      if (start == std::string::npos) {
        emit_text(src_.substr(pos), pos);
        break;
      }
      char kind = src_[start + 1];  // '{', '%' or '#'
      size_t after = start + 2;
      char sign = after < src_.size() && (src_[after] == '-' || src_[after] == '+') ? src_[after] : 0;
      std::string text = src_.substr(pos, start - pos);
      if (sign == '-') {
        while (!text.empty() && is_ws(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {
        lstrip(text, line_starting);
      }
      emit_text(text, pos);
      if (sign) ++after;
      if (kind == '#') {
        pos = end_comment(start, after);
      } else if (kind == '%' && is_raw(after)) {
        pos = raw_block(start, after);
      } else {
        pos = tag(start, after, kind);
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    push(Token::Kind::End, "", src_.size());
    return std::move(tokens_);
  }

 private:
  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;

  [[noreturn]] void fail(const std::string& why, size_t at) const {
    auto [l, c] = where(at);
    throw EvalError(why, l, c);
  }
  std::pair<int, int> where(size_t at) const {
    size_t l = size_t(std::upper_bound(line_starts_.begin(), line_starts_.end(), at) - line_starts_.begin());
    return {int(l), int(at - line_starts_[l - 1] + 1)};
  }
  void push(Token::Kind k, std::string text, size_t at) {
    auto [l, c] = where(at);
    tokens_.push_back(Token{k, std::move(text), l, c});
  }
  void emit_text(const std::string& text, size_t at) {
    if (!text.empty()) push(Token::Kind::Text, text, at);
  }

  size_t next_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  // lstrip_blocks: drop spaces between the start of the line and a block or comment tag.
  static void lstrip(std::string& text, bool line_starting) {
    size_t nl = text.rfind('\n');
    size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return;
    if (l_pos == text.size()) return;
    for (size_t i = l_pos; i < text.size(); ++i)
      if (!is_ws(text[i])) return;
    text.resize(l_pos);
  }

  // After a block/comment end: "-" eats all following whitespace, "+" nothing, else one newline.
  size_t after_block_end(size_t pos, char sign, bool trim_newline) const {
    if (sign == '-') {
      while (pos < src_.size() && is_ws(src_[pos])) ++pos;
    } else if (sign != '+' && trim_newline && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  size_t end_comment(size_t start, size_t after) {
    size_t end = src_.find("#}", after);
    if (end == std::string::npos) fail("unterminated comment: missing '#}'", start);
    char sign = end > after && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    return after_block_end(end + 2, sign, true);
  }

  size_t skip_ws(size_t p) const {
    while (p < src_.size() && is_ws(src_[p])) ++p;
    return p;
  }
  bool word_at(size_t p, const char* w) const {
    size_t n = std::strlen(w);
    if (src_.compare(p, n, w) != 0) return false;
    return p + n >= src_.size() || !(std::isalnum((unsigned char)src_[p + n]) || src_[p + n] == '_');
  }
  bool is_raw(size_t after) const { return word_at(skip_ws(after), "raw"); }

  // Parses the end of a "{% raw %}" / "{% endraw %}" tag starting at p; returns the position after it.
  size_t raw_tag_end(size_t p, size_t start, char* sign) const {
    p = skip_ws(p);
    *sign = 0;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) *sign = src_[p++];
    if (src_.compare(p, 2, "%}") != 0) fail("expected '%}' to close the raw tag", start);
    return p + 2;
  }

  size_t raw_block(size_t start, size_t after) {
    char sign;
    size_t body = raw_tag_end(skip_ws(after) + 3, start, &sign);
    // jinja2 applies no trim_blocks newline removal after "{% raw %}", only "-%}".
    body = after_block_end(body, sign, false);
    for (size_t p = src_.find("{%", body); p != std::string::npos; p = src_.find("{%", p + 2)) {
      size_t q = p + 2;
      char open_sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (open_sign) ++q;
      q = skip_ws(q);
      if (!word_at(q, "endraw")) continue;
      std::string text = src_.substr(body, p - body);
      if (open_sign == '-') {
        while (!text.empty() && is_ws(text.back())) text.pop_back();
      } else if (open_sign != '+') {
        lstrip(text, body > 0 && src_[body - 1] == '\n');
      }
      emit_text(text, body);
      char end_sign;
      size_t end = raw_tag_end(q + 6, p, &end_sign);
      return after_block_end(end, end_sign, true);
    }
    fail("unterminated raw block: missing '{% endraw %}'", start);
  }

  size_t tag(size_t start, size_t after, char kind) {
    bool block = kind == '%';
    push(block ? Token::Kind::BlockBegin : Token::Kind::VarBegin, "", start);
    size_t p = after;
    int depth = 0;  // open brackets: a '}' inside a dict literal does not close the tag
    while (true) {
      p = skip_ws(p);
      if (p >= src_.size()) fail(block ? "unterminated tag: missing '%}'" : "unterminated tag: missing '}}'", start);
      char sign = src_[p] == '-' || src_[p] == '+' ? src_[p] : 0;
      size_t q = p + (sign ? 1 : 0);
      if (depth == 0 && src_.compare(q, 2, block ? "%}" : "}}") == 0 && (block || sign != '+')) {
        push(block ? Token::Kind::BlockEnd : Token::Kind::VarEnd, "", p);
        size_t end = q + 2;
        if (block) return after_block_end(end, sign, true);
        return sign == '-' ? skip_ws(end) : end;
      }
      p = expression_token(p, depth, start);
    }
  }

  size_t expression_token(size_t p, int& depth, size_t tag_start) {
    char c = src_[p];
    if (std::isalpha((unsigned char)c) || c == '_') {
      size_t q = p;
      while (q < src_.size() && (std::isalnum((unsigned char)src_[q]) || src_[q] == '_')) ++q;
      push(Token::Kind::Name, src_.substr(p, q - p), p);
      return q;
    }
    if (std::isdigit((unsigned char)c)) return number(p);
    if (c == '\'' || c == '"') return string_literal(p);
    static const char* two[] = {"**", "//", "==", "!=", "<=", ">="};
    for (const char* op : two)
      if (src_.compare(p, 2, op) == 0) {
        push(Token::Kind::Op, op, p);
        return p + 2;
      }
    if (std::strchr("+-*/%~()[]{},.:|=<>", c)) {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
      push(Token::Kind::Op, std::string(1, c), p);
      return p + 1;
    }
    (void)tag_start;
    fail(std::string("unexpected character '") + c + "' in tag", p);
  }

  size_t number(size_t p) {
    size_t q = p;
    auto digits = [&] {
      while (q < src_.size() && (std::isdigit((unsigned char)src_[q]) || src_[q] == '_')) ++q;
    };
    digits();
    bool is_float = false;
    if (q + 1 < src_.size() && src_[q] == '.' && std::isdigit((unsigned char)src_[q + 1])) {
      is_float = true;
      ++q;
      digits();
    }
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < src_.size() && std::isdigit((unsigned char)src_[r])) {
        is_float = true;
        q = r;
        digits();
      }
    }
    std::string spelled;
    for (size_t i = p; i < q; ++i)
      if (src_[i] != '_') spelled += src_[i];
    push(is_float ? Token::Kind::Float : Token::Kind::Int, spelled, p);
    return q;
  }

  // Python string literal escapes (jinja2 decodes them with unicode-escape).
  size_t string_literal(size_t p) {
    char quote = src_[p];
    std::string out;
    size_t q = p + 1;
    while (true) {
      if (q >= src_.size()) fail("unterminated string literal", p);
      char c = src_[q];
      if (c == quote) break;
      if (c != '\\' || q + 1 >= src_.size()) {
        out += c;
        ++q;
        continue;
      }
      char e = src_[q + 1];
      q += 2;
      auto hex = [&](int n) {
        if (q + n > src_.size()) fail("truncated \\x/\\u escape in string literal", p);
        const auto v = parse_int(std::string_view(src_).substr(q, n), 16);
        if (!v || *v < 0 || *v > 0x10FFFF) fail("bad \\x/\\u/\\U escape in string literal", p);
        q += n;
        utf8_append(out, char32_t(*v));
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '0': out += '\0'; break;
        case '\n': break;  // a backslash-newline continues the literal
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default: out += '\\'; out += e;  // Python keeps unknown escapes as written
      }
    }
    push(Token::Kind::String, out, p);
    return q + 1;
  }
};

}  // namespace

std::vector<Token> lex(const std::string& source) {
  // jinja2 normalises every newline to "\n" and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).run();
}

}  // namespace soltrain::jinja
