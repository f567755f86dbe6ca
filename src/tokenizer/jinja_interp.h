// Tree-walking interpreter for a parsed template, with jinja2's scoping: a for-loop iteration and a macro
// call each get their own scope, so `set` inside them does not leak out (a namespace is how it does).
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja_ast.h"

namespace soltrain::jinja {

class Interpreter {
 public:
  explicit Interpreter(const Dict& globals);
  // Appends the rendering of `body` to `out`; throws EvalError with the position of the failing node.
  void run(const Body& body, std::string& out);

 private:
  using Scope = std::unordered_map<std::string, Value>;
  enum class Flow { Normal, Break, Continue };

  std::vector<std::shared_ptr<Scope>> scopes_;  // innermost last
  int loop_depth_ = 0;
  int eval_depth_ = 0, call_depth_ = 0;  // see jinja_limits.h
  int64_t steps_ = 0;
  const char* stack_base_ = nullptr;  // the C++ stack where run() began

  void step();  // counts one statement, expression or loop iteration against kMaxSteps

  Flow exec(const Body& body, std::string& out);
  Flow exec(const Stmt& s, std::string& out);
  Flow exec_for(const Stmt& s, std::string& out);
  void exec_set(const Stmt& s, const Value& v);
  Value define_macro(const Stmt& s);
  Value eval(const Expr& e);
  Value eval_node(const Expr& e);
  Value eval_compare(const Expr& e);
  CallArgs eval_args(const Expr& e, size_t first);
  Value lookup(const std::string& name) const;
  void assign(const std::vector<std::string>& targets, const Value& v);
};

}  // namespace soltrain::jinja
