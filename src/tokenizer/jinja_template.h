// A parsed Jinja template (the jinja2 subset chat templates use), rendered with Hugging Face's settings:
// trim_blocks, lstrip_blocks, loop controls, immutable sandbox, default (lenient) Undefined.
#pragma once
#include <memory>
#include <string>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace soltrain::jinja {

class Template {
 public:
  // Parses `source`; throws UserError "<name> line L, column C: why" on a syntax error.
  explicit Template(const std::string& source, std::string name = "template");

  // Renders with `variables` on top of the built-in globals (range, namespace, dict). Errors are UserError
  // "<name> line L, column C: why"; raise_exception(msg) from the template becomes "<name>: msg".
  std::string render(const Dict& variables) const;

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::shared_ptr<const Body> body_;  // shared so that templates copy cheaply
};

}  // namespace soltrain::jinja
