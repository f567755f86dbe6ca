// Errors raised while parsing or rendering a template; the engine adds the line and column before they
// reach the caller as a UserError.
#pragma once
#include <stdexcept>
#include <string>

namespace soltrain::jinja {

// Thrown where the position is not known yet (inside value operations, filters, methods); the
// interpreter fills in the innermost node's position as it unwinds.
struct EvalError : std::runtime_error {
  EvalError(const std::string& why, int line = 0, int column = 0)
      : std::runtime_error(why), line(line), column(column) {}
  int line, column;  // 0 while unknown
};

// raise_exception(msg) from the template itself: reported as the template author wrote it.
struct RaisedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace soltrain::jinja
