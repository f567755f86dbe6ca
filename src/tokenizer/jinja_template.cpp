// Template: lex + parse once, render many times; turns engine errors into one-line UserErrors.
#include "tokenizer/jinja_template.h"

#include "core/error.h"
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_parser.h"

namespace soltrain::jinja {

Template::Template(const std::string& source, std::string name) : name_(std::move(name)) {
  try {
    body_ = std::make_shared<const Body>(parse(lex(source)));
  } catch (const EvalError& e) {
    user_error(name_, " line ", e.line, ", column ", e.column, ": ", e.what());
  }
}

std::string Template::render(const Dict& variables) const {
  Dict globals = builtin_globals();
  globals.insert(globals.end(), variables.begin(), variables.end());  // later entries win in the interpreter
  std::string out;
  try {
    Interpreter(globals).run(*body_, out);
  } catch (const EvalError& e) {
    user_error(name_, " line ", e.line, ", column ", e.column, ": ", e.what());
  } catch (const RaisedError& e) {
    user_error(name_, ": ", e.what());
  }
  return out;
}

}  // namespace soltrain::jinja
