// Splits a Jinja template into text and tag tokens, applying whitespace control the way Hugging Face's
// environment does (trim_blocks=True, lstrip_blocks=True, "-"/"+" modifiers, trailing newline dropped).
#pragma once
#include <string>
#include <vector>

namespace soltrain::jinja {

struct Token {
  enum class Kind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
  Kind kind;
  std::string text;  // Text contents, name, decoded string literal, number spelling or operator
  int line = 1, column = 1;
};

// Throws EvalError (with position) on an unterminated tag, comment or string, or an unknown character.
std::vector<Token> lex(const std::string& source);

}  // namespace soltrain::jinja
