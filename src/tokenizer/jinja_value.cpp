// Value construction, Python-style printing (str, repr, float repr), equality and json.dumps.
#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_limits.h"

namespace soltrain::jinja {

Value Value::undefined(std::string name) {
  Value v;
  v.str = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::from(bool b) {
  Value v;
  v.kind = Kind::Bool;
  v.boolean = b;
  return v;
}
Value Value::from(int64_t i) {
  Value v;
  v.kind = Kind::Int;
  v.integer = i;
  return v;
}
Value Value::from(double d) {
  Value v;
  v.kind = Kind::Float;
  v.number = d;
  return v;
}
Value Value::from(std::string s) {
  Value v;
  v.kind = Kind::String;
  v.str = std::move(s);
  return v;
}
namespace {
void contain(Value& outer, const Value& item) {
  outer.depth = std::max(outer.depth, item.depth + 1);
  outer.holds_namespace = outer.holds_namespace || item.holds_namespace;
}
void check_depth(const Value& v) {
  if (v.depth > kMaxValueDepth) limit_exceeded("value nesting depth", kMaxValueDepth);
}
}  // namespace

Value Value::from(List l, bool is_tuple) {
  Value v;
  v.kind = Kind::List;
  v.tuple = is_tuple;
  for (const Value& x : l) contain(v, x);
  check_depth(v);
  v.list = std::make_shared<List>(std::move(l));
  return v;
}
Value Value::from(Dict d) {
  Value v;
  v.kind = Kind::Dict;
  for (const auto& kv : d) contain(v, kv.second);
  check_depth(v);
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}
Value Value::make_namespace(Dict d) {
  Value v = from(std::move(d));
  v.kind = Kind::Namespace;
  v.holds_namespace = true;
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return boolean;
    case Kind::Int: return integer != 0;
    case Kind::Float: return number != 0;
    case Kind::String: return !str.empty();
    case Kind::List: return !list->empty();
    case Kind::Dict: return !dict->empty();
    default: return true;
  }
}

double Value::as_double() const {
  return kind == Kind::Float ? number : kind == Kind::Bool ? double(boolean) : double(integer);
}
int64_t Value::as_int() const {
  return kind == Kind::Float ? int64_t(number) : kind == Kind::Bool ? int64_t(boolean) : integer;
}

const Value* Value::find(const std::string& key) const {
  if (!dict) return nullptr;
  for (const auto& [k, v] : *dict)
    if (k == key) return &v;
  return nullptr;
}

Value CallArgs::get(size_t i, const std::string& name, Value fallback) {
  if (i < positional.size()) return positional[i];
  for (auto& [k, v] : keyword)
    if (k == name) return v;
  return fallback;
}
bool CallArgs::has(size_t i, const std::string& name) const {
  if (i < positional.size()) return true;
  for (auto& kv : keyword)
    if (kv.first == name) return true;
  return false;
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::List: return v.tuple ? "tuple" : "list";
    case Value::Kind::Dict: return "dict";
    case Value::Kind::Namespace: return "Namespace";
    case Value::Kind::Callable: return "function";
  }
  return "?";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in scientific form, then laid out the way Python's repr does.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  bool neg = mant[0] == '-';
  std::string digits;
  for (char c : mant)
    if (c >= '0' && c <= '9') digits += c;
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0.";
      out.append(size_t(-exp - 1), '0');
      out += digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out += digits;
      out.append(size_t(exp) + 1 - digits.size(), '0');
      out += ".0";
    } else {
      out.append(digits, 0, size_t(exp) + 1);
      out += '.';
      out.append(digits, size_t(exp) + 1, std::string::npos);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return out;
}

static std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == q)
      out += std::string("\\") + char(c);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else
      out += char(c);
  }
  return out + q;
}

std::string to_repr(const Value& v) {
  if (v.kind == Value::Kind::String) return repr_string(v.str);
  if (v.kind == Value::Kind::Undefined) return "Undefined";
  return to_str(v);
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.boolean ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.integer);
    case Value::Kind::Float: return float_repr(v.number);
    case Value::Kind::String: return v.str;
    case Value::Kind::List: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) out += (i ? ", " : "") + to_repr((*v.list)[i]);
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::Kind::Dict:
    case Value::Kind::Namespace: {
      std::string out = v.kind == Value::Kind::Namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : *v.dict) {
        out += (first ? "" : ", ") + repr_string(k) + ": " + to_repr(x);
        first = false;
      }
      return out + (v.kind == Value::Kind::Namespace ? "}>" : "}");
    }
    case Value::Kind::Callable: return "<function>";
  }
  return "";
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return a.str == b.str;
    case K::List:
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case K::Dict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, x] : *a.dict) {
        const Value* y = b.find(k);
        if (!y || !equal(x, *y)) return false;
      }
      return true;
    case K::Namespace: return a.dict == b.dict;
    case K::Callable: return a.fn == b.fn;
    default: return false;
  }
}

static void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

static void json_value(std::string& out, const Value& v, const JsonStyle& st, int depth) {
  auto newline = [&](int d) {
    out += '\n';
    for (int i = 0; i < d; ++i) out += st.indent;
  };
  const std::string& item_sep = !st.item_sep.empty() ? st.item_sep : st.indented ? "," : ", ";
  switch (v.kind) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.boolean ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.integer); return;
    case Value::Kind::Float:
      if (std::isnan(v.number))
        out += "NaN";
      else if (std::isinf(v.number))
        out += v.number > 0 ? "Infinity" : "-Infinity";
      else
        out += float_repr(v.number);
      return;
    case Value::Kind::String: json_string(out, v.str); return;
    case Value::Kind::List:
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += item_sep;
        if (st.indented) newline(depth + 1);
        json_value(out, (*v.list)[i], st, depth + 1);
      }
      if (st.indented) newline(depth);
      out += ']';
      return;
    case Value::Kind::Dict: {
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : *v.dict) items.push_back(&kv);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (st.indented) newline(depth + 1);
        json_string(out, items[i]->first);
        out += st.key_sep;
        json_value(out, items[i]->second, st, depth + 1);
      }
      if (st.indented) newline(depth);
      out += '}';
      return;
    }
    default: throw EvalError("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

std::string to_json(const Value& v, const JsonStyle& style) {
  std::string out;
  json_value(out, v, style, 0);
  return out;
}

}  // namespace soltrain::jinja
