// Syntax tree of a parsed template: expressions and statements, each with its line and column.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace soltrain::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,  // value
    Name,     // name
    List,     // args
    Tuple,    // args
    Dict,     // kwargs hold nothing: args alternate key, value
    Attr,     // args[0].name
    Item,     // args[0][args[1]]
    Slice,    // args[0][args[1]:args[2]:args[3]] (null = omitted)
    Call,     // args[0](args[1..], kwargs)
    Filter,   // args[0] | name(args[1..], kwargs)
    Test,     // args[0] is [not] name(args[1..], kwargs)
    Unary,    // name in {"-", "+", "not"} applied to args[0]
    Binary,   // args[0] name args[1], name in + - * / // % ** ~
    And,      // args[0] and args[1]
    Or,       // args[0] or args[1]
    Compare,  // args[0] ops[0] args[1] ops[1] args[2] ... (chained like Python)
    Cond,     // args[0] if args[1] else args[2] (args[2] null = undefined)
  };
  Kind kind;
  int line = 0, column = 0;
  Value value;
  std::string name;
  bool negated = false;  // "is not"
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  int depth = 1;  // of the tree below and including this node (the parser keeps it under kMaxNesting)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    Text,      // text
    Output,    // {{ expr }}
    If,        // conds[i] → bodies[i]; else_body
    For,       // for targets in expr [if cond] body [else else_body]
    Set,       // set targets = expr, or set targets[0].attr = expr (attr non-empty)
    SetBlock,  // set targets[0] %}body{% endset
    Macro,     // macro name(params) body
    Break,
    Continue,
    Block,  // a body rendered in place ({% generation %} from HF's AssistantTracker)
  };
  Kind kind;
  int line = 0, column = 0;
  std::string text;  // Text contents; macro name
  std::string attr;  // Set on a namespace attribute
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::string> targets;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters with optional defaults
};

}  // namespace soltrain::jinja
