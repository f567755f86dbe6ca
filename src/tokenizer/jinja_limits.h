// The sandbox's limits: a chat template comes with a downloaded model, so it must not be able to crash,
// hang or exhaust the memory of the trainer. Each is far above what a real template needs (the Qwen3 and
// Llama 3 templates nest 6 deep, call no macro recursively and take ~1.5 x 10^4 steps for a 2000-message conversation)
// and each exceeded one is an EvalError that names it.
#pragma once
#include <cstdint>
#include <string>

#include "tokenizer/jinja_error.h"

namespace soltrain::jinja {

// Nesting of blocks, of parentheses/brackets and of operators in one expression (the AST's depth). The
// parser counts it as it recurses, so no input can overflow the C++ stack while parsing.
inline constexpr int kMaxNesting = 200;
// Macro calls in progress at once (a macro calling itself).
inline constexpr int kMaxCallDepth = 100;
// Statements and expressions being evaluated at once, across macro calls: what bounds the interpreter's
// C++ stack. A level's frames differ by build (ASan pads every local: 8 MB of stack overflowed at ~1500
// levels in scripts/fuzz.sh's build), so the stack used is bounded in bytes as well.
inline constexpr int kMaxEvalDepth = 2000;
inline constexpr int64_t kMaxEvalStackBytes = 2 << 20;
// Statements, expressions and loop iterations executed in one render: nested loops stop here.
inline constexpr int64_t kMaxSteps = 1'000'000;  // ~0.8 s of nested loops
// Nesting of lists and dicts in one value (JSON inputs are refused past 512 levels when parsed).
inline constexpr int kMaxValueDepth = 1000;
// Bytes of any one string (the rendered text included) the template may build.
inline constexpr int64_t kMaxStringBytes = 100'000'000;

inline std::string limit_message(const std::string& what, int64_t limit) {
  return "template exceeds the sandbox's " + what + " limit (" + std::to_string(limit) + ")";
}
[[noreturn]] inline void limit_exceeded(const std::string& what, int64_t limit) {
  throw EvalError(limit_message(what, limit));
}

// A string of `n` bytes is about to be built: refused past kMaxStringBytes, before allocating.
inline void check_string_size(int64_t n) {
  if (n < 0 || n > kMaxStringBytes) limit_exceeded("output size (bytes)", kMaxStringBytes);
}

}  // namespace soltrain::jinja
