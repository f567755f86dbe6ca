// jinja2's built-in filters, tests, global functions and the Python methods of str, dict and list that
// templates call, with jinja2's attribute/item lookup rules (a missing key is Undefined, not an error).
#pragma once
#include <string>

#include "tokenizer/jinja_value.h"

namespace soltrain::jinja {

// {{ value | name(args) }}; throws EvalError for an unknown filter or bad arguments.
Value apply_filter(const std::string& name, const Value& value, CallArgs& args);
bool has_filter(const std::string& name);
// {{ value is name(args) }}
bool apply_test(const std::string& name, const Value& value, CallArgs& args);
bool has_test(const std::string& name);
// obj.name (attribute first, then key) and obj[key] (key first, then attribute), as jinja2 does.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// Python slicing obj[start:stop:step] of a list or string; omitted parts are Undefined.
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// The values a for loop visits: list items, dict keys, string characters; Undefined visits nothing.
List iterate(const Value& v);
// The globals every template sees: range, namespace, dict.
Dict builtin_globals();
// Length in Python's sense (code points for strings).
int64_t length(const Value& v);

}  // namespace soltrain::jinja
