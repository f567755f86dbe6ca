// Filters, tests, globals and attribute lookup with jinja2's (and Python's) semantics.
#include "tokenizer/jinja_builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <optional>

#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_limits.h"
#include "tokenizer/jinja_ops.h"
#include "tokenizer/jinja_text.h"
#include "tokenizer/utf8.h"

namespace soltrain::jinja {
namespace {

[[noreturn]] void fail(const std::string& why) {
  throw EvalError(why);
}

std::string need_string(const Value& v, const std::string& what) {
  if (v.is_undefined()) undefined_error(v);
  if (!v.is_string()) fail(what + ": expected a string, got " + type_name(v));
  return v.str;
}

int64_t need_int(const Value& v, const std::string& what) {
  if (!v.is_integral()) fail(what + ": expected an integer, got " + type_name(v));
  return v.as_int();
}

std::string ascii_map(std::string s, int (*f)(int)) {
  for (char& c : s) c = char(f((unsigned char)c));
  return s;
}
std::string py_capitalize(const std::string& s) {
  std::string out = ascii_map(s, [](int c) { return std::tolower(c); });
  if (!out.empty()) out[0] = char(std::toupper((unsigned char)out[0]));
  return out;
}
// Python's str.title(): a letter after a non-letter is upper-cased, the others lower-cased.
std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    unsigned char u = c;
    if (std::isalpha(u)) {
      c = char(prev_cased ? std::tolower(u) : std::toupper(u));
      prev_cased = true;
    } else {
      prev_cased = u >= 0x80 && prev_cased;
    }
  }
  return out;
}
// jinja2's title filter: words start after whitespace, '-', or an opening bracket.
std::string jinja_title(const std::string& s) {
  std::string out;
  bool start = true;
  for (char c : s) {
    unsigned char u = c;
    bool sep = std::isspace(u) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    out += sep ? c : char(start ? std::toupper(u) : std::tolower(u));
    start = sep;
  }
  return out;
}

List split_whitespace(const std::string& s, int64_t maxsplit) {
  std::u32string cps = decode_utf8(s);
  List out;
  size_t i = 0, n = cps.size();
  while (true) {
    while (i < n && is_py_space(cps[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      size_t e = n;
      while (e > i && is_py_space(cps[e - 1])) --e;
      out.push_back(Value::from(encode_utf8(std::u32string_view(cps).substr(i, e - i))));
      break;
    }
    size_t j = i;
    while (j < n && !is_py_space(cps[j])) ++j;
    out.push_back(Value::from(encode_utf8(std::u32string_view(cps).substr(i, j - i))));
    i = j;
  }
  return out;
}

List split_sep(const std::string& s, const std::string& sep, int64_t maxsplit, bool from_right) {
  if (sep.empty()) fail("split: empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t pos = 0;
    while (maxsplit < 0 || int64_t(parts.size()) < maxsplit) {
      size_t f = s.find(sep, pos);
      if (f == std::string::npos) break;
      parts.push_back(s.substr(pos, f - pos));
      pos = f + sep.size();
    }
    parts.push_back(s.substr(pos));
  } else {
    size_t end = s.size();
    std::vector<std::string> rev;
    while (maxsplit < 0 || int64_t(rev.size()) < maxsplit) {
      if (end < sep.size()) break;
      size_t f = s.rfind(sep, end - sep.size());
      if (f == std::string::npos) break;
      rev.push_back(s.substr(f + sep.size(), end - f - sep.size()));
      end = f;
    }
    rev.push_back(s.substr(0, end));
    parts.assign(rev.rbegin(), rev.rend());
  }
  List out;
  for (auto& p : parts) out.push_back(Value::from(std::move(p)));
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every code point
    std::u32string cps = decode_utf8(s);
    int64_t done = 0;
    for (char32_t c : cps) {
      if (count < 0 || done < count) {
        check_string_size(int64_t(out.size() + to.size()));
        out += to;
        ++done;
      }
      utf8_append(out, c);
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    check_string_size(int64_t(out.size() + to.size()));
    out += to;
    pos = f + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

// str.format with {}, {0} and {name} fields; format specs other than empty are not supported.
std::string py_format(const std::string& fmt, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '{') {
      size_t close = fmt.find('}', i);
      if (close == std::string::npos) fail("format: single '{' in format string");
      std::string field = fmt.substr(i + 1, close - i - 1);
      if (field.find(':') != std::string::npos || field.find('!') != std::string::npos)
        fail("format: format specs and conversions are not supported ('{" + field + "}')");
      Value v;
      if (field.empty()) {
        if (auto_index >= args.positional.size()) fail("format: not enough positional arguments");
        v = args.positional[auto_index++];
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return std::isdigit((unsigned char)d); })) {
        const auto k = parse_int(field);
        if (!k || size_t(*k) >= args.positional.size()) fail("format: positional argument " + field + " missing");
        v = args.positional[size_t(*k)];
      } else {
        bool found = false;
        for (auto& [name, x] : args.keyword)
          if (name == field) {
            v = x;
            found = true;
          }
        if (!found) fail("format: keyword argument '" + field + "' missing");
      }
      out += to_str(v);
      i = close;
    } else {
      out += c;
    }
  }
  return out;
}

bool starts_or_ends(const std::string& s, const Value& affix, bool start, const std::string& what) {
  if (affix.is_list()) {
    for (const Value& a : *affix.list)
      if (starts_or_ends(s, a, start, what)) return true;
    return false;
  }
  std::string a = need_string(affix, what);
  if (a.size() > s.size()) return false;
  return start ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
}

Value str_method(const std::string& s, const std::string& name, CallArgs& a) {
  const std::string what = "str." + name;
  auto opt_string = [&](size_t i, const std::string& key) -> std::optional<std::string> {
    Value v = a.get(i, key, Value::none());
    if (v.is_none()) return std::nullopt;
    return need_string(v, what);
  };
  if (name == "startswith" || name == "endswith")
    return Value::from(starts_or_ends(s, a.get(0, "prefix"), name == "startswith", what));
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    auto chars = opt_string(0, "chars");
    return Value::from(py_strip(s, chars ? &*chars : nullptr, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    auto sep = opt_string(0, "sep");
    int64_t maxsplit = need_int(a.get(1, "maxsplit", Value::from(-1)), what);
    if (!sep) {
      if (name == "rsplit" && maxsplit >= 0) fail("rsplit without a separator and with maxsplit is not supported");
      return Value::from(split_whitespace(s, maxsplit));
    }
    return Value::from(split_sep(s, *sep, maxsplit, name == "rsplit"));
  }
  if (name == "replace")
    return Value::from(replace_all(s, need_string(a.get(0, "old"), what), need_string(a.get(1, "new"), what),
                                   need_int(a.get(2, "count", Value::from(-1)), what)));
  if (name == "upper") return Value::from(ascii_map(s, [](int c) { return std::toupper(c); }));
  if (name == "lower") return Value::from(ascii_map(s, [](int c) { return std::tolower(c); }));
  if (name == "capitalize") return Value::from(py_capitalize(s));
  if (name == "title") return Value::from(py_title(s));
  if (name == "format") return Value::from(py_format(s, a));
  if (name == "join") {
    std::string out;
    List items = iterate(a.get(0, "iterable"));
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += s;
      out += need_string(items[i], what);
    }
    return Value::from(std::move(out));
  }
  if (name == "find" || name == "count" || name == "index") {
    std::string sub = need_string(a.get(0, "sub"), what);
    if (name == "count") {
      if (sub.empty()) return Value::from(int64_t(decode_utf8(s).size() + 1));
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value::from(n);
    }
    size_t p = s.find(sub);
    if (p == std::string::npos) {
      if (name == "index") fail("substring not found");
      return Value::from(int64_t(-1));
    }
    return Value::from(int64_t(decode_utf8(s.substr(0, p)).size()));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    std::string x = need_string(a.get(0, "prefix"), what);
    bool pre = name == "removeprefix";
    if (starts_or_ends(s, Value::from(x), pre, what))
      return Value::from(pre ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
    return Value::from(s);
  }
  if (name == "splitlines") {
    List out;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t f = s.find_first_of("\r\n", pos);
      if (f == std::string::npos) {
        out.push_back(Value::from(s.substr(pos)));
        break;
      }
      out.push_back(Value::from(s.substr(pos, f - pos)));
      pos = f + ((s[f] == '\r' && f + 1 < s.size() && s[f + 1] == '\n') ? 2 : 1);
    }
    return Value::from(std::move(out));
  }
  auto all_of = [&](int (*pred)(int)) {
    return Value::from(!s.empty() && std::all_of(s.begin(), s.end(), [&](char c) { return pred((unsigned char)c); }));
  };
  if (name == "isdigit") return all_of([](int c) { return std::isdigit(c); });
  if (name == "isalpha") return all_of([](int c) { return std::isalpha(c); });
  if (name == "isalnum") return all_of([](int c) { return std::isalnum(c); });
  if (name == "isspace") return all_of([](int c) { return std::isspace(c); });
  if (name == "islower")
    return Value::from(s != ascii_map(s, [](int c) { return std::toupper(c); }) &&
                       s == ascii_map(s, [](int c) { return std::tolower(c); }));
  if (name == "isupper")
    return Value::from(s != ascii_map(s, [](int c) { return std::tolower(c); }) &&
                       s == ascii_map(s, [](int c) { return std::toupper(c); }));
  fail("unsupported string method '" + name + "'");
}

const char* const kStrMethods[] = {
    "startswith",   "endswith",   "strip",   "lstrip",  "rstrip",  "split",   "rsplit",  "replace", "upper",
    "lower",        "capitalize", "title",   "format",  "join",    "find",    "count",   "index",   "removeprefix",
    "removesuffix", "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper"};
// Mutating dict methods exist in Python but jinja2's immutable sandbox refuses them; the same here.
const char* const kDictMethods[] = {"get",    "items",      "keys",  "values",  "pop",
                                    "update", "setdefault", "clear", "popitem", "copy"};
const char* const kListMethods[] = {"index",  "count", "append", "pop",     "extend", "insert",
                                    "remove", "clear", "sort",   "reverse", "copy"};

template <size_t N>
bool in(const char* const (&names)[N], const std::string& n) {
  return std::find_if(std::begin(names), std::end(names), [&](const char* x) { return n == x; }) != std::end(names);
}

List dict_items(const Value& d) {
  List out;
  for (const auto& [k, v] : *d.dict) out.push_back(Value::from(List{Value::from(k), v}, true));
  return out;
}

Value dict_method(const Value& d, const std::string& name, CallArgs& a) {
  if (name == "get") {
    Value key = a.get(0, "key");
    const Value* v = key.is_string() ? d.find(key.str) : nullptr;
    return v ? *v : a.get(1, "default", Value::none());
  }
  if (name == "items") return Value::from(dict_items(d));
  List out;
  if (name == "keys")
    for (const auto& kv : *d.dict) out.push_back(Value::from(kv.first));
  else if (name == "values")
    for (const auto& kv : *d.dict) out.push_back(kv.second);
  else if (name == "copy")
    return Value::from(Dict(*d.dict));
  else
    fail("access to the mutating method dict." + name + " is not allowed in a chat template (immutable sandbox)");
  return Value::from(std::move(out));
}

Value list_method(const Value& l, const std::string& name, CallArgs& a) {
  if (name == "index" || name == "count") {
    Value x = a.get(0, "value");
    int64_t n = 0;
    for (size_t i = 0; i < l.list->size(); ++i)
      if (equal((*l.list)[i], x)) {
        if (name == "index") return Value::from(int64_t(i));
        ++n;
      }
    if (name == "index") fail("list.index(x): x not in list");
    return Value::from(n);
  }
  if (name == "copy") return Value::from(List(*l.list));
  fail("access to the mutating method list." + name + " is not allowed in a chat template (immutable sandbox)");
}

Value bound(const Value& self, std::string name, Value (*method)(const Value&, const std::string&, CallArgs&)) {
  return Value::function([self, name, method](CallArgs& a) { return method(self, name, a); });
}

std::string object_name(const Value& v) {
  return v.kind == Value::Kind::String ? "str object"
         : v.is_list()                 ? type_name(v) + " object"
         : v.is_none()                 ? "None"
                                       : type_name(v) + " object";
}

Value missing_attr(const Value& obj, const std::string& name) {
  return Value::undefined("'" + object_name(obj) + "' has no attribute '" + name + "'");
}

int64_t py_index(int64_t i, int64_t n) {
  return i < 0 ? i + n : i;
}

Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(c); });
    const auto index = numeric ? parse_int(part) : std::nullopt;
    if (numeric && !index) fail("attribute path: index " + part + " out of range");
    cur = numeric ? get_item(cur, Value::from(*index)) : get_item(cur, Value::from(part));
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

// Filters/tests that take a test name and its arguments from position `first` on.
bool run_test_from(const Value& item, CallArgs& a, size_t first) {
  if (a.positional.size() <= first) return item.truthy();
  std::string test = need_string(a.positional[first], "test name");
  CallArgs targs;
  targs.positional.assign(a.positional.begin() + long(first) + 1, a.positional.end());
  targs.what = "test '" + test + "'";
  return apply_test(test, item, targs);
}

std::string fold(const Value& v, bool case_sensitive) {
  return case_sensitive || !v.is_string() ? std::string() : ascii_map(v.str, [](int c) { return std::tolower(c); });
}
bool sort_less(const Value& a, const Value& b, bool case_sensitive) {
  if (!case_sensitive && a.is_string() && b.is_string()) return fold(a, false) < fold(b, false);
  return less(a, b);
}

Value to_int(const Value& v, const Value& fallback) {
  if (v.is_integral()) return Value::from(v.as_int());
  if (v.kind == Value::Kind::Float) return Value::from(int64_t(v.number));
  if (v.is_string()) {
    std::string s = py_strip(v.str, nullptr, true, true);
    std::string digits;
    for (char c : s)
      if (c != '_') digits += c;
    try {
      size_t used = 0;
      int64_t i = std::stoll(digits, &used);
      if (used == digits.size() && !digits.empty()) return Value::from(i);
      double d = std::stod(digits, &used);
      if (used == digits.size() && std::isfinite(d)) return Value::from(int64_t(d));
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value to_float(const Value& v, const Value& fallback) {
  if (v.is_number()) return Value::from(v.as_double());
  if (v.is_string()) {
    try {
      std::string s = py_strip(v.str, nullptr, true, true);
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size()) return Value::from(d);
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

using FilterFn = Value (*)(const Value&, CallArgs&);

Value f_tojson(const Value& v, CallArgs& a) {
  JsonStyle st;
  Value indent = a.get(0, "indent", Value::none());
  if (indent.is_integral()) {
    st.indented = true;
    check_string_size(indent.as_int());
    st.indent = std::string(size_t(std::max<int64_t>(0, indent.as_int())), ' ');
  } else if (indent.is_string()) {
    st.indented = true;
    st.indent = indent.str;
  } else if (!indent.is_none()) {
    fail("tojson: indent must be an integer, a string or none");
  }
  if (a.get(1, "ensure_ascii", Value::from(false)).truthy()) fail("tojson: ensure_ascii=true is not supported");
  Value seps = a.get(2, "separators", Value::none());
  if (seps.is_list() && seps.list->size() == 2) {
    st.item_sep = need_string((*seps.list)[0], "tojson separators");
    st.key_sep = need_string((*seps.list)[1], "tojson separators");
  }
  st.sort_keys = a.get(3, "sort_keys", Value::from(false)).truthy();
  return Value::from(to_json(v, st));
}

Value f_join(const Value& v, CallArgs& a) {
  std::string sep = to_str(a.get(0, "d", Value::from("")));
  Value attr = a.get(1, "attribute", Value::none());
  std::string out;
  List items = iterate(v);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += to_str(attr.is_none() ? items[i] : attr_path(items[i], to_str(attr)));
  }
  return Value::from(std::move(out));
}

Value f_default(const Value& v, CallArgs& a) {
  bool boolean = a.get(1, "boolean", Value::from(false)).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return a.get(0, "default_value", Value::from(""));
  return v;
}

Value f_map(const Value& v, CallArgs& a) {
  List out;
  bool by_attr = a.has(99, "attribute") && a.positional.empty();
  for (const Value& item : iterate(v)) {
    if (by_attr) {
      Value x = attr_path(item, to_str(a.get(99, "attribute")));
      if (x.is_undefined() && a.has(99, "default")) x = a.get(99, "default");
      out.push_back(x);
    } else {
      if (a.positional.empty()) fail("map: expected a filter name or attribute=");
      std::string filter = need_string(a.positional[0], "map");
      CallArgs fargs;
      fargs.positional.assign(a.positional.begin() + 1, a.positional.end());
      fargs.keyword = a.keyword;
      out.push_back(apply_filter(filter, item, fargs));
    }
  }
  return Value::from(std::move(out));
}

Value select_impl(const Value& v, CallArgs& a, bool by_attr, bool keep) {
  List out;
  for (const Value& item : iterate(v)) {
    Value subject = by_attr ? attr_path(item, need_string(a.get(0, "attribute"), "selectattr")) : item;
    if (run_test_from(subject, a, by_attr ? 1 : 0) == keep) out.push_back(item);
  }
  return Value::from(std::move(out));
}

Value f_sort(const Value& v, CallArgs& a) {
  bool reverse = a.get(0, "reverse", Value::from(false)).truthy();
  bool cs = a.get(1, "case_sensitive", Value::from(false)).truthy();
  Value attr = a.get(2, "attribute", Value::none());
  List items = iterate(v);
  auto key = [&](const Value& x) { return attr.is_none() ? x : attr_path(x, to_str(attr)); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? sort_less(key(y), key(x), cs) : sort_less(key(x), key(y), cs);
  });
  return Value::from(std::move(items));
}

Value f_unique(const Value& v, CallArgs& a) {
  bool cs = a.get(0, "case_sensitive", Value::from(false)).truthy();
  Value attr = a.get(1, "attribute", Value::none());
  List out, seen;
  for (const Value& item : iterate(v)) {
    Value k = attr.is_none() ? item : attr_path(item, to_str(attr));
    if (!cs && k.is_string()) k = Value::from(fold(k, false));
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, k); })) {
      seen.push_back(k);
      out.push_back(item);
    }
  }
  return Value::from(std::move(out));
}

Value min_max(const Value& v, CallArgs& a, bool want_max) {
  bool cs = a.get(0, "case_sensitive", Value::from(false)).truthy();
  Value attr = a.get(1, "attribute", Value::none());
  List items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& x) { return attr.is_none() ? x : attr_path(x, to_str(attr)); };
  Value best = items[0];
  for (const Value& x : items)
    if (want_max ? sort_less(key(best), key(x), cs) : sort_less(key(x), key(best), cs)) best = x;
  return best;
}

Value f_indent(const Value& v, CallArgs& a) {
  Value w = a.get(0, "width", Value::from(4));
  if (!w.is_string()) check_string_size(need_int(w, "indent"));
  std::string ind = w.is_string() ? w.str : std::string(size_t(std::max<int64_t>(0, need_int(w, "indent"))), ' ');
  bool first = a.get(1, "first", Value::from(false)).truthy();
  bool blank = a.get(2, "blank", Value::from(false)).truthy();
  std::string s = to_str(v) + "\n";  // jinja2 appends a newline so splitlines keeps a trailing empty line
  CallArgs none;
  List lines = *str_method(s, "splitlines", none).list;
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i].str;
    if (i) {
      out += '\n';
      if (blank || !line.empty()) out += ind;
    }
    out += line;
  }
  return Value::from(first ? ind + out : out);
}

Value f_round(const Value& v, CallArgs& a) {
  int64_t precision = need_int(a.get(0, "precision", Value::from(0)), "round");
  std::string method = to_str(a.get(1, "method", Value::from("common")));
  double scale = std::pow(10.0, double(precision));
  double x = v.as_double() * scale;
  double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
  return Value::from(r / scale);
}

Value f_first_last(const Value& v, bool last) {
  List items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return last ? items.back() : items.front();
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> table = {
      {"tojson", f_tojson},
      {"trim",
       [](const Value& v, CallArgs& a) {
         Value chars = a.get(0, "chars", Value::none());
         std::string c = chars.is_none() ? std::string() : to_str(chars);
         return Value::from(py_strip(to_str(v), chars.is_none() ? nullptr : &c, true, true));
       }},
      {"length", [](const Value& v, CallArgs&) { return Value::from(length(v)); }},
      {"count", [](const Value& v, CallArgs&) { return Value::from(length(v)); }},
      {"join", f_join},
      {"default", f_default},
      {"d", f_default},
      {"items",
       [](const Value& v, CallArgs&) {
         if (v.is_undefined()) return Value::from(List{});
         if (!v.is_mapping()) fail("items: can only get item pairs from a mapping, got " + type_name(v));
         return Value::from(dict_items(v));
       }},
      {"upper", [](const Value& v,
                   CallArgs&) { return Value::from(ascii_map(to_str(v), [](int c) { return std::toupper(c); })); }},
      {"lower", [](const Value& v,
                   CallArgs&) { return Value::from(ascii_map(to_str(v), [](int c) { return std::tolower(c); })); }},
      {"capitalize", [](const Value& v, CallArgs&) { return Value::from(py_capitalize(to_str(v))); }},
      {"title", [](const Value& v, CallArgs&) { return Value::from(jinja_title(to_str(v))); }},
      {"replace",
       [](const Value& v, CallArgs& a) {
         Value count = a.get(2, "count", Value::none());
         return Value::from(replace_all(to_str(v), to_str(a.get(0, "old")), to_str(a.get(1, "new")),
                                        count.is_none() ? -1 : need_int(count, "replace")));
       }},
      {"first", [](const Value& v, CallArgs&) { return f_first_last(v, false); }},
      {"last", [](const Value& v, CallArgs&) { return f_first_last(v, true); }},
      {"list", [](const Value& v, CallArgs&) { return Value::from(iterate(v)); }},
      {"string", [](const Value& v, CallArgs&) { return Value::from(to_str(v)); }},
      {"safe", [](const Value& v, CallArgs&) { return Value::from(to_str(v)); }},
      {"int", [](const Value& v, CallArgs& a) { return to_int(v, a.get(0, "default", Value::from(0))); }},
      {"float", [](const Value& v, CallArgs& a) { return to_float(v, a.get(0, "default", Value::from(0.0))); }},
      {"abs",
       [](const Value& v, CallArgs&) {
         if (v.is_integral()) return Value::from(v.as_int() < 0 ? -v.as_int() : v.as_int());
         if (v.kind == Value::Kind::Float) return Value::from(std::fabs(v.number));
         fail("abs: bad operand type '" + type_name(v) + "'");
       }},
      {"round", f_round},
      {"map", f_map},
      {"select", [](const Value& v, CallArgs& a) { return select_impl(v, a, false, true); }},
      {"reject", [](const Value& v, CallArgs& a) { return select_impl(v, a, false, false); }},
      {"selectattr", [](const Value& v, CallArgs& a) { return select_impl(v, a, true, true); }},
      {"rejectattr", [](const Value& v, CallArgs& a) { return select_impl(v, a, true, false); }},
      {"sort", f_sort},
      {"unique", f_unique},
      {"min", [](const Value& v, CallArgs& a) { return min_max(v, a, false); }},
      {"max", [](const Value& v, CallArgs& a) { return min_max(v, a, true); }},
      {"sum",
       [](const Value& v, CallArgs& a) {
         Value attr = a.get(0, "attribute", Value::none());
         Value total = a.get(1, "start", Value::from(0));
         for (const Value& x : iterate(v))
           total = binary_op("+", total, attr.is_none() ? x : attr_path(x, to_str(attr)));
         return total;
       }},
      {"reverse",
       [](const Value& v, CallArgs&) {
         if (v.is_string()) {
           std::u32string cps = decode_utf8(v.str);
           std::reverse(cps.begin(), cps.end());
           return Value::from(encode_utf8(cps));
         }
         List items = iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::from(std::move(items));
       }},
      {"indent", f_indent},
      {"wordcount",
       [](const Value& v, CallArgs&) { return Value::from(int64_t(split_whitespace(to_str(v), -1).size())); }},
  };
  return table;
}

using TestFn = bool (*)(const Value&, CallArgs&);

bool compare_test(const Value& v, CallArgs& a, const std::string& op) {
  Value other = a.get(0, "other");
  if (op == "==") return equal(v, other);
  if (op == "!=") return !equal(v, other);
  if (op == "<") return less(v, other);
  if (op == "<=") return !less(other, v);
  if (op == ">") return less(other, v);
  return !less(v, other);
}

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> table = {
      {"defined", [](const Value& v, CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, CallArgs&) { return v.is_undefined(); }},
      {"none", [](const Value& v, CallArgs&) { return v.is_none(); }},
      {"boolean", [](const Value& v, CallArgs&) { return v.kind == Value::Kind::Bool; }},
      {"true", [](const Value& v, CallArgs&) { return v.kind == Value::Kind::Bool && v.boolean; }},
      {"false", [](const Value& v, CallArgs&) { return v.kind == Value::Kind::Bool && !v.boolean; }},
      {"integer", [](const Value& v, CallArgs&) { return v.kind == Value::Kind::Int; }},
      {"float", [](const Value& v, CallArgs&) { return v.kind == Value::Kind::Float; }},
      {"number", [](const Value& v, CallArgs&) { return v.is_number(); }},
      {"string", [](const Value& v, CallArgs&) { return v.is_string(); }},
      {"mapping", [](const Value& v, CallArgs&) { return v.kind == Value::Kind::Dict; }},
      // Undefined defines __iter__, __len__ and __getitem__ in jinja2, so it passes both.
      {"iterable",
       [](const Value& v, CallArgs&) { return v.is_string() || v.is_list() || v.is_mapping() || v.is_undefined(); }},
      {"sequence",
       [](const Value& v, CallArgs&) {
         return v.is_string() || v.is_list() || v.kind == Value::Kind::Dict || v.is_undefined();
       }},
      {"callable", [](const Value& v, CallArgs&) { return v.kind == Value::Kind::Callable; }},
      {"sameas",
       [](const Value& v, CallArgs& a) {
         Value o = a.get(0, "other");
         if (v.kind != o.kind) return false;
         if (v.is_list()) return v.list == o.list;
         if (v.is_mapping()) return v.dict == o.dict;
         return equal(v, o);  // None, True, False and small ints are singletons in Python
       }},
      {"eq", [](const Value& v, CallArgs& a) { return compare_test(v, a, "=="); }},
      {"equalto", [](const Value& v, CallArgs& a) { return compare_test(v, a, "=="); }},
      {"==", [](const Value& v, CallArgs& a) { return compare_test(v, a, "=="); }},
      {"ne", [](const Value& v, CallArgs& a) { return compare_test(v, a, "!="); }},
      {"!=", [](const Value& v, CallArgs& a) { return compare_test(v, a, "!="); }},
      {"lt", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<"); }},
      {"lessthan", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<"); }},
      {"<", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<"); }},
      {"le", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<="); }},
      {"<=", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<="); }},
      {"gt", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">"); }},
      {"greaterthan", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">"); }},
      {">", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">"); }},
      {"ge", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">="); }},
      {">=", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">="); }},
      {"in", [](const Value& v, CallArgs& a) { return contains(a.get(0, "seq"), v); }},
      {"odd", [](const Value& v, CallArgs&) { return need_int(v, "odd") % 2 != 0; }},
      {"even", [](const Value& v, CallArgs&) { return need_int(v, "even") % 2 == 0; }},
      {"divisibleby",
       [](const Value& v, CallArgs& a) {
         int64_t n = need_int(a.get(0, "num"), "divisibleby");
         return n != 0 && (n == -1 || need_int(v, "divisibleby") % n == 0);  // INT64_MIN % -1 traps
       }},
      {"lower",
       [](const Value& v, CallArgs&) {
         return v.is_string() && v.str == ascii_map(v.str, [](int c) { return std::tolower(c); });
       }},
      {"upper",
       [](const Value& v, CallArgs&) {
         return v.is_string() && v.str == ascii_map(v.str, [](int c) { return std::toupper(c); });
       }},
  };
  return table;
}

}  // namespace

Value apply_filter(const std::string& name, const Value& value, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("no filter named '" + name + "'");
  return it->second(value, args);
}
bool has_filter(const std::string& name) {
  return filters().count(name) > 0;
}

bool apply_test(const std::string& name, const Value& value, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail("no test named '" + name + "'");
  return it->second(value, args);
}
bool has_test(const std::string& name) {
  return tests().count(name) > 0;
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return int64_t(decode_utf8(v.str).size());
    case Value::Kind::List: return int64_t(v.list->size());
    case Value::Kind::Dict:
    case Value::Kind::Namespace: return int64_t(v.dict->size());
    default: fail("object of type '" + type_name(v) + "' has no len()");
  }
}

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Value::Kind::Undefined: undefined_error(obj);
    case Value::Kind::String:
      if (in(kStrMethods, name))
        return Value::function([s = obj.str, name](CallArgs& a) { return str_method(s, name, a); });
      break;
    case Value::Kind::Dict:
      if (in(kDictMethods, name)) return bound(obj, name, dict_method);
      if (const Value* v = obj.find(name)) return *v;
      break;
    case Value::Kind::Namespace:
      if (const Value* v = obj.find(name)) return *v;
      break;
    case Value::Kind::List:
      if (in(kListMethods, name)) return bound(obj, name, list_method);
      break;
    default: break;
  }
  return missing_attr(obj, name);
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Value::Kind::Undefined: undefined_error(obj);
    case Value::Kind::Dict:
    case Value::Kind::Namespace:
      if (key.is_string()) {
        if (const Value* v = obj.find(key.str)) return *v;
        return get_attr(obj, key.str);
      }
      break;
    case Value::Kind::List:
      if (key.is_integral()) {
        int64_t n = int64_t(obj.list->size()), i = py_index(key.as_int(), n);
        if (i >= 0 && i < n) return (*obj.list)[size_t(i)];
        return Value::undefined(type_name(obj) + " object has no element " + std::to_string(key.as_int()));
      }
      break;
    case Value::Kind::String:
      if (key.is_integral()) {
        std::u32string cps = decode_utf8(obj.str);
        int64_t n = int64_t(cps.size()), i = py_index(key.as_int(), n);
        if (i >= 0 && i < n) return Value::from(encode_utf8(cps.substr(size_t(i), 1)));
        return Value::undefined("string index out of range");
      }
      break;
    default: break;
  }
  if (key.is_string()) return get_attr(obj, key.str);
  return Value::undefined("'" + object_name(obj) + "' has no element " + to_repr(key));
}

Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) undefined_error(obj);
  if (!obj.is_string() && !obj.is_list()) fail("'" + type_name(obj) + "' object is not subscriptable");
  auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    return need_int(v, std::string("slice ") + what);
  };
  std::u32string cps = obj.is_string() ? decode_utf8(obj.str) : std::u32string();
  int64_t n = obj.is_string() ? int64_t(cps.size()) : int64_t(obj.list->size());
  int64_t step = opt(step_v, "step").value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  // Python's slice.indices(): clamp to [0, n] going forward, [-1, n-1] going backward.
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t i = *v < 0 ? *v + n : *v;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t start = clamp(opt(start_v, "start"), step > 0 ? 0 : n - 1);
  int64_t stop = clamp(opt(stop_v, "stop"), step > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
  if (obj.is_string()) {
    std::u32string out;
    for (int64_t i : idx) out += cps[size_t(i)];
    return Value::from(encode_utf8(out));
  }
  List out;
  for (int64_t i : idx) out.push_back((*obj.list)[size_t(i)]);
  return Value::from(std::move(out), obj.tuple);
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return *v.list;
    case Value::Kind::Dict: {
      List keys;
      for (const auto& kv : *v.dict) keys.push_back(Value::from(kv.first));
      return keys;
    }
    case Value::Kind::String: {
      List chars;
      for (char32_t c : decode_utf8(v.str)) chars.push_back(Value::from(encode_utf8(std::u32string(1, c))));
      return chars;
    }
    default: fail("'" + type_name(v) + "' object is not iterable");
  }
}

Dict builtin_globals() {
  Dict g;
  g.emplace_back("range", Value::function([](CallArgs& a) {
                   if (a.positional.empty() || a.positional.size() > 3) fail("range expected 1 to 3 integer arguments");
                   int64_t start = 0, stop, step = 1;
                   if (a.positional.size() == 1) {
                     stop = need_int(a.positional[0], "range");
                   } else {
                     start = need_int(a.positional[0], "range");
                     stop = need_int(a.positional[1], "range");
                     if (a.positional.size() == 3) step = need_int(a.positional[2], "range");
                   }
                   if (step == 0) fail("range() arg 3 must not be zero");
                   List out;
                   for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
                     if (out.size() >= 100000) fail("range too big, the sandbox allows at most 100000 items");
                     out.push_back(Value::from(i));
                     if (__builtin_add_overflow(i, step, &i)) break;  // past INT64_MAX/MIN: nothing more in range
                   }
                   return Value::from(std::move(out));
                 }));
  auto from_kwargs = [](CallArgs& a) {
    Dict d;
    if (!a.positional.empty()) {
      if (a.positional.size() > 1 || a.positional[0].kind != Value::Kind::Dict)
        fail("expected at most one positional argument, a dict");
      d = *a.positional[0].dict;
    }
    for (auto& [k, v] : a.keyword) {
      const std::string& key = k;  // clang 14 cannot capture a structured binding
      auto it = std::find_if(d.begin(), d.end(), [&](auto& kv) { return kv.first == key; });
      if (it != d.end())
        it->second = v;
      else
        d.emplace_back(k, v);
    }
    return d;
  };
  g.emplace_back("namespace",
                 Value::function([from_kwargs](CallArgs& a) { return Value::make_namespace(from_kwargs(a)); }));
  g.emplace_back("dict", Value::function([from_kwargs](CallArgs& a) { return Value::from(from_kwargs(a)); }));
  return g;
}

}  // namespace soltrain::jinja
