// Recursive-descent parser following jinja2's grammar and operator precedence:
// cond-if < or < and < not < comparisons < + - < ~ < * / // % < ** < unary < postfix/filters/tests.
#include "tokenizer/jinja_parser.h"

#include <algorithm>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_limits.h"
#include "tokenizer/jinja_text.h"

namespace soltrain::jinja {
namespace {

using TK = Token::Kind;
using EK = Expr::Kind;
using SK = Stmt::Kind;

std::string describe(const Token& t) {
  switch (t.kind) {
    case TK::Text: return "text";
    case TK::VarBegin: return "'{{'";
    case TK::VarEnd: return "end of print statement '}}'";
    case TK::BlockBegin: return "'{%'";
    case TK::BlockEnd: return "end of statement block '%}'";
    case TK::Name: return "'" + t.text + "'";
    case TK::String: return "string literal";
    case TK::Int:
    case TK::Float: return "number " + t.text;
    case TK::Op: return "'" + t.text + "'";
    case TK::End: return "end of template";
  }
  return "?";
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& t) : t_(t) {}

  Body parse_template() {
    std::string end;
    Body body = parse_body({}, &end, nullptr);
    return body;
  }

 private:
  const std::vector<Token>& t_;
  size_t i_ = 0;

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  [[noreturn]] void fail(const std::string& why, const Token& at) const { throw EvalError(why, at.line, at.column); }
  bool is_op(const char* op) const { return cur().kind == TK::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == TK::Name && cur().text == n; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()), cur());
  }
  std::string expect_name(const char* what) {
    if (cur().kind != TK::Name) fail(std::string("expected ") + what + ", got " + describe(cur()), cur());
    return t_[i_++].text;
  }
  void expect_block_end() {
    if (cur().kind != TK::BlockEnd) fail("expected end of statement block '%}', got " + describe(cur()), cur());
    ++i_;
  }

  // The parser's recursion depth, one per level a reader sees (a block, a bracket, a call's arguments, a
  // prefix operator, an inline else): every cycle of the recursive descent passes through one of them.
  int nesting_ = 0;
  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) {
      if (++p.nesting_ > kMaxNesting) p.fail_limit();
    }
    ~Nest() { --p.nesting_; }
  };
  [[noreturn]] void fail_limit() const { fail(limit_message("nesting depth", kMaxNesting), cur()); }
  // Operator chains (a + b + c ...) deepen the tree without recursing: the depth is kept per node instead.
  void grow(Expr& parent, const ExprPtr& child) {
    if (!child) return;
    parent.depth = std::max(parent.depth, child->depth + 1);
    if (parent.depth > kMaxNesting) fail_limit();
  }
  void adopt(Expr& parent, ExprPtr child) {
    grow(parent, child);
    parent.args.push_back(std::move(child));
  }

  ExprPtr node(EK kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  StmtPtr stmt(SK kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->column = at.column;
    return s;
  }

  // Statements until one of `ends` ({% endfor %}, {% else %}...); stores which one in *end, positioned
  // just after its name. `opener` is the block being closed, for the error at the end of the template.
  Body parse_body(const std::vector<std::string>& ends, std::string* end, const Token* opener) {
    Nest nest(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TK::End) {
        if (ends.empty()) return body;
        fail("unexpected end of template: the '" + opener->text + "' block opened here needs '{% " + ends.back() +
                 " %}'",
             *opener);
      }
      if (t.kind == TK::Text) {
        auto s = stmt(SK::Text, t);
        s->text = t.text;
        body.push_back(std::move(s));
        ++i_;
      } else if (t.kind == TK::VarBegin) {
        ++i_;
        auto s = stmt(SK::Output, t);
        s->expr = parse_tuple();
        if (cur().kind != TK::VarEnd) fail("expected '}}', got " + describe(cur()), cur());
        ++i_;
        body.push_back(std::move(s));
      } else if (t.kind == TK::BlockBegin) {
        ++i_;
        const Token& name = cur();
        if (name.kind != TK::Name) fail("expected a statement name after '{%', got " + describe(name), name);
        if (std::find(ends.begin(), ends.end(), name.text) != ends.end()) {
          *end = name.text;
          ++i_;
          return body;
        }
        if (name.text.rfind("end", 0) == 0 || name.text == "elif" || name.text == "else") {
          std::string expected;
          for (const auto& e : ends) expected += (expected.empty() ? "'" : " or '") + e + "'";
          fail("unexpected '" + name.text + "'" +
                   (ends.empty() ? std::string(": no block is open")
                                 : ": the innermost open block is '" + opener->text + "' (line " +
                                       std::to_string(opener->line) + "), which expects " + expected),
               name);
        }
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t), t);
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& name = cur();
    const std::string& n = name.text;
    ++i_;
    if (n == "if") return parse_if(name);
    if (n == "for") return parse_for(name);
    if (n == "set") return parse_set(name);
    if (n == "macro") return parse_macro(name);
    if (n == "break" || n == "continue") {
      expect_block_end();
      return stmt(n == "break" ? SK::Break : SK::Continue, name);
    }
    if (n == "generation") {
      expect_block_end();
      auto s = stmt(SK::Block, name);
      std::string end;
      s->body = parse_body({"endgeneration"}, &end, &name);
      expect_block_end();
      return s;
    }
    fail("unknown or unsupported statement '" + n + "'", name);
  }

  StmtPtr parse_if(const Token& at) {
    auto s = stmt(SK::If, at);
    s->conds.push_back(parse_expression(false));
    expect_block_end();
    while (true) {
      std::string end;
      Body b = parse_body({"elif", "else", "endif"}, &end, &at);
      s->bodies.push_back(std::move(b));
      if (end == "elif") {
        s->conds.push_back(parse_expression(false));
        expect_block_end();
      } else if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"}, &end, &at);
        expect_block_end();
        return s;
      } else {
        expect_block_end();
        return s;
      }
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = accept_op("(");
    do {
      names.push_back(expect_name("a variable name"));
    } while (accept_op(","));
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for(const Token& at) {
    auto s = stmt(SK::For, at);
    s->targets = parse_targets();
    if (!accept_name("in")) fail("expected 'in' in for loop, got " + describe(cur()), cur());
    s->expr = parse_tuple(false);
    if (is_name("recursive")) fail("recursive for loops are not supported", cur());
    if (accept_name("if")) s->cond = parse_expression(true);
    expect_block_end();
    std::string end;
    s->body = parse_body({"else", "endfor"}, &end, &at);
    expect_block_end();
    if (end == "else") {
      s->else_body = parse_body({"endfor"}, &end, &at);
      expect_block_end();
    }
    return s;
  }

  StmtPtr parse_set(const Token& at) {
    auto s = stmt(SK::Set, at);
    if (cur().kind == TK::Name && peek().kind == TK::Op && peek().text == ".") {
      s->targets.push_back(t_[i_].text);
      i_ += 2;
      s->attr = expect_name("an attribute name");
    } else {
      s->targets = parse_targets();
    }
    if (accept_op("=")) {
      s->expr = parse_tuple();
      expect_block_end();
      return s;
    }
    if (!s->attr.empty() || s->targets.size() != 1) fail("expected '=' in set statement", cur());
    expect_block_end();
    s->kind = SK::SetBlock;
    std::string end;
    s->body = parse_body({"endset"}, &end, &at);
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro(const Token& at) {
    auto s = stmt(SK::Macro, at);
    s->text = expect_name("a macro name");
    expect_op("(");
    while (!accept_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (accept_op(")")) break;
      std::string p = expect_name("a parameter name");
      ExprPtr def;
      if (accept_op("=")) def = parse_expression(true);
      s->params.emplace_back(std::move(p), std::move(def));
    }
    expect_block_end();
    std::string end;
    s->body = parse_body({"endmacro"}, &end, &at);
    if (cur().kind == TK::Name) ++i_;  // jinja2 allows "{% endmacro name %}"
    expect_block_end();
    return s;
  }

  // ---- expressions ----

  // An expression, or a tuple when commas follow ({{ a, b }}, set a, b = 1, 2).
  ExprPtr parse_tuple(bool with_cond = true) {
    const Token& at = cur();
    ExprPtr first = parse_expression(with_cond);
    if (!is_op(",")) return first;
    auto t = node(EK::Tuple, at);
    adopt(*t, std::move(first));
    while (accept_op(",")) {
      if (at_expression_end()) break;
      adopt(*t, parse_expression(with_cond));
    }
    return t;
  }
  bool at_expression_end() const {
    return cur().kind == TK::VarEnd || cur().kind == TK::BlockEnd || is_op(")") || is_name("if");
  }

  ExprPtr parse_expression(bool with_cond) { return with_cond ? parse_cond() : parse_or(); }

  ExprPtr parse_cond() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      auto c = node(EK::Cond, cur());
      ++i_;
      ExprPtr test = parse_or();
      Nest nest(*this);
      ExprPtr other = accept_name("else") ? parse_cond() : nullptr;
      adopt(*c, std::move(e));
      adopt(*c, std::move(test));
      adopt(*c, std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(EK kind, const Token& at, ExprPtr a, ExprPtr b, std::string op = {}) {
    auto e = node(kind, at);
    e->name = std::move(op);
    adopt(*e, std::move(a));
    adopt(*e, std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Token& at = t_[i_++];
      e = binary(EK::Or, at, std::move(e), parse_and());
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Token& at = t_[i_++];
      e = binary(EK::And, at, std::move(e), parse_not());
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      Nest nest(*this);
      auto e = node(EK::Unary, t_[i_++]);
      e->name = "not";
      adopt(*e, parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const Token& at = cur();
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().kind == TK::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                   cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = t_[i_++].text;
      } else if (is_name("in")) {
        ++i_;
        op = "in";
      } else if (is_name("not") && peek().kind == TK::Name && peek().text == "in") {
        i_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(EK::Compare, at);
        adopt(*cmp, std::move(first));
      }
      cmp->ops.push_back(op);
      adopt(*cmp, parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = t_[i_++];
      e = binary(EK::Binary, at, std::move(e), parse_concat(), at.text);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token& at = t_[i_++];
      e = binary(EK::Binary, at, std::move(e), parse_math2(), "~");
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = t_[i_++];
      e = binary(EK::Binary, at, std::move(e), parse_pow(), at.text);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& at = t_[i_++];
      e = binary(EK::Binary, at, std::move(e), parse_unary(true), "**");
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      Nest nest(*this);
      e = node(EK::Unary, cur());
      e->name = t_[i_++].text;
      adopt(*e, parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.kind) {
      case TK::Name: {
        ++i_;
        auto e = node(EK::Literal, t);
        if (t.text == "true" || t.text == "True")
          e->value = Value::from(true);
        else if (t.text == "false" || t.text == "False")
          e->value = Value::from(false);
        else if (t.text == "none" || t.text == "None")
          e->value = Value::none();
        else {
          e->kind = EK::Name;
          e->name = t.text;
        }
        return e;
      }
      case TK::String: {
        std::string s;
        while (cur().kind == TK::String) s += t_[i_++].text;  // adjacent literals concatenate
        auto e = node(EK::Literal, t);
        e->value = Value::from(std::move(s));
        return e;
      }
      case TK::Int:
      case TK::Float: {
        ++i_;
        auto e = node(EK::Literal, t);
        if (t.kind == TK::Int) {
          const auto v = parse_int(t.text);
          if (!v) fail("number out of range: " + t.text, t);
          e->value = Value::from(*v);
        } else {
          try {
            e->value = Value::from(std::stod(t.text));
          } catch (const std::out_of_range&) {
            fail("number out of range: " + t.text, t);
          }
        }
        return e;
      }
      case TK::Op:
        if (t.text == "(") {
          Nest nest(*this);
          ++i_;
          if (accept_op(")")) return node(EK::Tuple, t);
          ExprPtr inner = parse_tuple();
          expect_op(")");
          return inner;
        }
        if (t.text == "[") {
          Nest nest(*this);
          ++i_;
          auto e = node(EK::List, t);
          while (!accept_op("]")) {
            if (!e->args.empty()) {
              expect_op(",");
              if (accept_op("]")) break;
            }
            adopt(*e, parse_expression(true));
          }
          return e;
        }
        if (t.text == "{") {
          Nest nest(*this);
          ++i_;
          auto e = node(EK::Dict, t);
          while (!accept_op("}")) {
            if (!e->args.empty()) {
              expect_op(",");
              if (accept_op("}")) break;
            }
            adopt(*e, parse_expression(true));
            expect_op(":");
            adopt(*e, parse_expression(true));
          }
          return e;
        }
        break;
      default: break;
    }
    fail("expected an expression, got " + describe(t), t);
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target) {
    const Token& at = t_[i_++];
    if (at.text == ".") {
      const Token& n = cur();
      if (n.kind == TK::Name) {
        auto e = node(EK::Attr, at);
        e->name = t_[i_++].text;
        adopt(*e, std::move(target));
        return e;
      }
      if (n.kind == TK::Int) {  // foo.0 is foo[0]
        auto e = node(EK::Item, at);
        adopt(*e, std::move(target));
        auto idx = node(EK::Literal, n);
        const auto v = parse_int(n.text);
        if (!v) fail("index out of range: " + n.text, n);
        idx->value = Value::from(*v);
        ++i_;
        adopt(*e, std::move(idx));
        return e;
      }
      fail("expected an attribute name after '.', got " + describe(n), n);
    }
    // '[' index or slice ']'
    Nest nest(*this);
    ExprPtr parts[3];
    int colons = 0;
    while (!is_op("]")) {
      if (accept_op(":")) {
        if (++colons > 2) fail("too many ':' in slice", cur());
        continue;
      }
      if (parts[colons]) fail("expected ']' or ':', got " + describe(cur()), cur());
      parts[colons] = parse_expression(true);
    }
    expect_op("]");
    if (colons == 0) {
      if (!parts[0]) fail("empty subscript '[]'", at);
      auto e = node(EK::Item, at);
      adopt(*e, std::move(target));
      adopt(*e, std::move(parts[0]));
      return e;
    }
    auto e = node(EK::Slice, at);
    adopt(*e, std::move(target));
    for (auto& p : parts) adopt(*e, std::move(p));
    return e;
  }

  void parse_call_args(Expr& e) {
    Nest nest(*this);
    expect_op("(");
    bool first = true;
    while (!accept_op(")")) {
      if (!first) {
        expect_op(",");
        if (accept_op(")")) break;
      }
      first = false;
      if (cur().kind == TK::Name && peek().kind == TK::Op && peek().text == "=") {
        std::string key = t_[i_].text;
        i_ += 2;
        ExprPtr v = parse_expression(true);
        grow(e, v);
        e.kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (!e.kwargs.empty()) fail("positional argument after keyword argument", cur());
        adopt(e, parse_expression(true));
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(EK::Call, cur());
    adopt(*e, std::move(callee));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr target) {
    ++i_;  // '|'
    auto e = node(EK::Filter, cur());
    const Token& name = cur();
    e->name = expect_name("a filter name after '|'");
    if (!has_filter(e->name)) fail("no filter named '" + e->name + "'", name);
    adopt(*e, std::move(target));
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  ExprPtr parse_test(ExprPtr target) {
    ++i_;  // 'is'
    auto e = node(EK::Test, cur());
    e->negated = accept_name("not");
    const Token& name = cur();
    e->name = expect_name("a test name after 'is'");
    if (!has_test(e->name)) fail("no test named '" + e->name + "'", name);
    adopt(*e, std::move(target));
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((cur().kind == TK::Name && !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") &&
                !is_name("in") && !is_name("not") && !is_name("is")) ||
               cur().kind == TK::String || cur().kind == TK::Int || cur().kind == TK::Float || is_op("[") ||
               is_op("{")) {
      // jinja2 takes one bare argument: "x is divisibleby 3", "x is sameas false".
      adopt(*e, parse_postfix(parse_primary()));
    }
    return e;
  }
};

}  // namespace

Body parse(const std::vector<Token>& tokens) {
  return Parser(tokens).parse_template();
}

}  // namespace soltrain::jinja
