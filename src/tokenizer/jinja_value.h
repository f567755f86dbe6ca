// The value type of the Jinja template engine: Python-like objects (None, bool, int, float, str, list,
// dict, namespace, callable) plus jinja2's Undefined, with Python's str()/repr(), truthiness and equality.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace soltrain::jinja {

struct Value;
struct CallArgs;
using List = std::vector<Value>;
// Insertion-ordered like a Python dict: tojson must keep the order the caller gave.
using Dict = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(CallArgs&)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

  Kind kind = Kind::Undefined;
  bool boolean = false;
  bool tuple = false;  // a List that came from a tuple: only changes how it prints
  int64_t integer = 0;
  double number = 0;
  std::string str;  // String contents; for Undefined, the name that was missing (for the error message)
  // Lists and dicts are shared, not copied: the sandbox is immutable, so only a namespace is ever written.
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // Dict and Namespace
  std::shared_ptr<Function> fn;
  // Nesting of lists/dicts below this value, and whether a namespace is among them: kept at construction
  // so that no value is deeper than kMaxValueDepth (printing and freeing one recurse) and no namespace
  // can end up inside itself (jinja_limits.h).
  int depth = 0;
  bool holds_namespace = false;

  static Value undefined(std::string name = {});
  static Value none();
  static Value from(bool b);
  static Value from(int64_t i);
  static Value from(int i) { return from(int64_t(i)); }
  static Value from(double d);
  static Value from(std::string s);
  static Value from(const char* s) { return from(std::string(s)); }
  static Value from(List l, bool is_tuple = false);
  static Value from(Dict d);
  static Value make_namespace(Dict d);
  static Value function(Function f);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_mapping() const { return kind == Kind::Dict || kind == Kind::Namespace; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_integral() const { return kind == Kind::Int || kind == Kind::Bool; }

  // Python truthiness (Undefined is false).
  bool truthy() const;
  // Numeric value of a Bool/Int/Float.
  double as_double() const;
  int64_t as_int() const;
  // Looks up a dict key; nullptr when absent.
  const Value* find(const std::string& key) const;
};

// Arguments of a call: positional, then keyword in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  std::string what;  // "filter 'join'", "macro 'f'": names the callee in errors

  // The argument at position i or named `name`, or `fallback` when neither was given.
  Value get(size_t i, const std::string& name, Value fallback = Value::undefined());
  bool has(size_t i, const std::string& name) const;
};

// Python type name ("str", "int", "dict", ...) for error messages.
std::string type_name(const Value& v);
// Python's str(): what {{ v }} prints. Undefined prints as "".
std::string to_str(const Value& v);
// Python's repr(): how items inside a printed list or dict appear.
std::string to_repr(const Value& v);
// Python's float repr: shortest round-trip digits, exponent form outside [1e-4, 1e16).
std::string float_repr(double d);
// Python equality (1 == 1.0 == True; dicts compare regardless of order).
bool equal(const Value& a, const Value& b);

// How json.dumps lays out its output (HF's tojson: ensure_ascii=False, the given indent, default separators).
struct JsonStyle {
  bool indented = false;  // indent=None when false
  std::string indent;     // the string for one level (Python turns indent=2 into two spaces)
  std::string item_sep;   // empty: json.dumps' default, ", " without indent and "," with it
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonStyle& style = {});

// JSON → Value; objects keep the iteration order of the json type (ordered_json keeps insertion order).
template <typename Json>
Value from_json(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::from(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::from(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return Value::from(int64_t(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float: return Value::from(j.template get<double>());
    case nlohmann::json::value_t::string: return Value::from(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e));
      return Value::from(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      d.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json(it.value()));
      return Value::from(std::move(d));
    }
    default: return Value::none();  // binary and discarded values never come from parsed JSON
  }
}

}  // namespace soltrain::jinja
