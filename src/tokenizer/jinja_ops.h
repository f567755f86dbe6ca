// Python semantics of the template operators: arithmetic, ~, ordering comparisons and `in`.
#pragma once
#include <string>

#include "tokenizer/jinja_value.h"

namespace soltrain::jinja {

// op in + - * / // % ** ~; throws EvalError on unsupported operand types (and on Undefined).
Value binary_op(const std::string& op, const Value& a, const Value& b);
// a < b for numbers, strings and lists; throws EvalError otherwise.
bool less(const Value& a, const Value& b);
// item in container: substring, list element or dict key.
bool contains(const Value& container, const Value& item);
// Error for using an Undefined where a value is needed, with jinja2's message.
[[noreturn]] void undefined_error(const Value& u);

}  // namespace soltrain::jinja
