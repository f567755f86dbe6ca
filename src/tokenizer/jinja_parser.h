// Parses Jinja tokens into a statement tree (the subset of jinja2 that chat templates use).
#pragma once
#include <vector>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace soltrain::jinja {

// Throws EvalError with the position of the offending token.
Body parse(const std::vector<Token>& tokens);

}  // namespace soltrain::jinja
