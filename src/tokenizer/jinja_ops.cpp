// Operators with Python's rules (floor division and modulo round toward negative infinity, / is float).
#include "tokenizer/jinja_ops.h"

#include <algorithm>
#include <cmath>

#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_limits.h"

namespace soltrain::jinja {

void undefined_error(const Value& u) {
  throw EvalError(u.str.empty() ? std::string("value is undefined") : u.str);
}

static void check_defined(const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
}

static int64_t checked(bool overflowed, const int64_t& r) {  // r by reference: read after the builtin wrote it
  if (overflowed) throw EvalError("integer overflow: the result does not fit in 64 bits");
  return r;
}

[[noreturn]] static void unsupported(const std::string& op, const Value& a, const Value& b) {
  throw EvalError("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

static Value repeat(const Value& seq, int64_t n) {
  n = std::max<int64_t>(n, 0);
  if (seq.is_string()) {
    if (!seq.str.empty()) check_string_size(n > kMaxStringBytes ? n : n * int64_t(seq.str.size()));
    std::string out;
    out.reserve(size_t(n) * seq.str.size());
    for (int64_t i = 0; i < n; ++i) out += seq.str;
    return Value::from(std::move(out));
  }
  // Items are copied (a string item with all its bytes), so the copies count against the same limit.
  int64_t bytes = 0;
  for (const Value& v : *seq.list) bytes += int64_t(v.str.size()) + int64_t(sizeof(Value));
  if (bytes > 0) check_string_size(n > kMaxStringBytes ? n : n * bytes);
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return Value::from(std::move(out), seq.tuple);
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string l = to_str(a), r = to_str(b);
    check_string_size(int64_t(l.size() + r.size()));
    return Value::from(l + r);
  }
  check_defined(a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_string_size(int64_t(a.str.size() + b.str.size()));
      return Value::from(a.str + b.str);
    }
    if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::from(std::move(out), a.tuple);
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && b.is_integral()) return repeat(a, b.as_int());
    if (a.is_integral() && (b.is_string() || b.is_list())) return repeat(b, a.as_int());
  }
  if (!a.is_number() || !b.is_number()) unsupported(op, a, b);
  bool ints = a.is_integral() && b.is_integral();
  int64_t x = a.as_int(), y = b.as_int();
  double p = a.as_double(), q = b.as_double();
  // Python's integers do not overflow; ours are 64-bit, and a result that does not fit is an error rather
  // than undefined behaviour.
  int64_t r = 0;
  if (op == "+") return ints ? Value::from(checked(__builtin_add_overflow(x, y, &r), r)) : Value::from(p + q);
  if (op == "-") return ints ? Value::from(checked(__builtin_sub_overflow(x, y, &r), r)) : Value::from(p - q);
  if (op == "*") return ints ? Value::from(checked(__builtin_mul_overflow(x, y, &r), r)) : Value::from(p * q);
  if (op == "/") {
    if (q == 0) throw EvalError("division by zero");
    return Value::from(p / q);
  }
  if (op == "//" || op == "%") {
    if (q == 0) throw EvalError(op == "//" ? "integer division by zero" : "modulo by zero");
    if (ints) {
      if (y == -1) return Value::from(op == "//" ? checked(__builtin_sub_overflow(int64_t(0), x, &r), r) : int64_t(0));
      int64_t d = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --d;
        m += y;
      }
      return Value::from(op == "//" ? d : m);
    }
    double m = std::fmod(p, q);
    if (m != 0 && ((m < 0) != (q < 0))) m += q;
    return Value::from(op == "//" ? std::floor(p / q) : m);
  }
  if (op == "**") {
    if (ints && y >= 0) {  // by squaring: y can be huge when x is 0, 1 or -1
      int64_t acc = 1, base = x;
      for (int64_t e = y; e > 0; e >>= 1) {
        if (e & 1) checked(__builtin_mul_overflow(acc, base, &acc), acc);
        if (e > 1) checked(__builtin_mul_overflow(base, base, &base), base);
      }
      return Value::from(acc);
    }
    return Value::from(std::pow(p, q));
  }
  unsupported(op, a, b);
}

bool less(const Value& a, const Value& b) {
  check_defined(a, b);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.str < b.str;  // UTF-8 byte order is code point order
  if (a.is_list() && b.is_list()) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t i = 0; i < n; ++i) {
      if (equal((*a.list)[i], (*b.list)[i])) continue;
      return less((*a.list)[i], (*b.list)[i]);
    }
    return a.list->size() < b.list->size();
  }
  throw EvalError("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::String:
      if (!item.is_string()) throw EvalError("'in <string>' requires string as left operand, not " + type_name(item));
      return container.str.find(item.str) != std::string::npos;
    case Value::Kind::List:
      for (const Value& v : *container.list)
        if (equal(v, item)) return true;
      return false;
    case Value::Kind::Dict: return item.is_string() && container.find(item.str) != nullptr;
    default: throw EvalError("argument of type '" + type_name(container) + "' is not iterable");
  }
}

}  // namespace soltrain::jinja
