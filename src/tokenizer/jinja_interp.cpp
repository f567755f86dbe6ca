// Executes statements and evaluates expressions; errors get the line and column of the innermost node.
#include "tokenizer/jinja_interp.h"

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_limits.h"
#include "tokenizer/jinja_ops.h"

namespace soltrain::jinja {

using EK = Expr::Kind;
using SK = Stmt::Kind;

namespace {
// Restores the scope stack when a macro call or loop iteration ends, also by exception.
template <typename T>
struct Restore {
  T& ref;
  T saved;
  Restore(T& r, T next) : ref(r), saved(std::move(r)) { ref = std::move(next); }
  ~Restore() { ref = std::move(saved); }
};
// Counts one level of evaluation in progress against a limit, also when unwinding by exception. With
// `stack_base`, the C++ stack used since then is bounded too (it grows down on every platform we build for).
struct Depth {
  int& d;
  Depth(int& depth, int limit, const char* what, const char* stack_base = nullptr) : d(depth) {
    if (d >= limit) limit_exceeded(what, limit);
    if (stack_base && stack_base - static_cast<const char*>(__builtin_frame_address(0)) > kMaxEvalStackBytes)
      limit_exceeded(std::string(what) + " (stack bytes)", kMaxEvalStackBytes);
    ++d;
  }
  ~Depth() { --d; }
};
}  // namespace

void Interpreter::step() {
  if (++steps_ > kMaxSteps) limit_exceeded("total steps", kMaxSteps);
}

Interpreter::Interpreter(const Dict& globals) {
  auto root = std::make_shared<Scope>();
  for (const auto& [k, v] : globals) (*root)[k] = v;
  scopes_.push_back(std::move(root));
}

void Interpreter::run(const Body& body, std::string& out) {
  stack_base_ = static_cast<const char*>(__builtin_frame_address(0));
  if (exec(body, out) != Flow::Normal) throw EvalError("'break' or 'continue' outside a for loop");
}

Value Interpreter::lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    auto f = (*it)->find(name);
    if (f != (*it)->end()) return f->second;
  }
  return Value::undefined("'" + name + "' is undefined");
}

void Interpreter::assign(const std::vector<std::string>& targets, const Value& v) {
  Scope& scope = *scopes_.back();
  if (targets.size() == 1) {
    scope[targets[0]] = v;
    return;
  }
  List items = iterate(v);
  if (items.size() != targets.size())
    throw EvalError("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) +
                    " names");
  for (size_t i = 0; i < targets.size(); ++i) scope[targets[i]] = items[i];
}

Interpreter::Flow Interpreter::exec(const Body& body, std::string& out) {
  for (const auto& s : body) {
    Flow f = exec(*s, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, std::string& out) {
  try {
    step();
    Depth depth(eval_depth_, kMaxEvalDepth, "evaluation depth", stack_base_);
    switch (s.kind) {
      case SK::Text:
        check_string_size(int64_t(out.size() + s.text.size()));
        out += s.text;
        return Flow::Normal;
      case SK::Output: {
        const std::string v = to_str(eval(*s.expr));
        check_string_size(int64_t(out.size() + v.size()));
        out += v;
        return Flow::Normal;
      }
      case SK::If:
        for (size_t i = 0; i < s.conds.size(); ++i)
          if (eval(*s.conds[i]).truthy()) return exec(s.bodies[i], out);
        return exec(s.else_body, out);
      case SK::For: return exec_for(s, out);
      case SK::Set: exec_set(s, eval(*s.expr)); return Flow::Normal;
      case SK::SetBlock: {
        std::string captured;
        Flow f = exec(s.body, captured);
        scopes_.back()->insert_or_assign(s.targets[0], Value::from(std::move(captured)));
        return f;
      }
      case SK::Macro: scopes_.back()->insert_or_assign(s.text, define_macro(s)); return Flow::Normal;
      case SK::Break:
      case SK::Continue:
        if (loop_depth_ == 0)
          throw EvalError(std::string("'") + (s.kind == SK::Break ? "break" : "continue") + "' outside a for loop");
        return s.kind == SK::Break ? Flow::Break : Flow::Continue;
      case SK::Block: return exec(s.body, out);
    }
  } catch (EvalError& e) {
    if (e.line == 0) {
      e.line = s.line;
      e.column = s.column;
    }
    throw;
  }
  return Flow::Normal;
}

void Interpreter::exec_set(const Stmt& s, const Value& v) {
  if (s.attr.empty()) {
    assign(s.targets, v);
    return;
  }
  Value ns = lookup(s.targets[0]);
  if (ns.kind != Value::Kind::Namespace)
    throw EvalError("cannot assign attribute '" + s.attr + "' on '" + s.targets[0] + "': it is not a namespace");
  // Namespaces are the only mutable values: one inside another could make a cycle, and a value that grows
  // deeper at every assignment must stop where constructed ones do.
  if (v.holds_namespace)
    throw EvalError("cannot assign a namespace (or a value holding one) to '" + s.targets[0] + "." + s.attr +
                    "': the sandbox keeps namespaces apart");
  if (v.depth + 1 > kMaxValueDepth) limit_exceeded("value nesting depth", kMaxValueDepth);
  for (auto& kv : *ns.dict)
    if (kv.first == s.attr) {
      kv.second = v;
      return;
    }
  ns.dict->emplace_back(s.attr, v);
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s, std::string& out) {
  List all;
  try {
    all = iterate(eval(*s.expr));
  } catch (EvalError& e) {
    if (e.line == 0) {  // point at what is being iterated, not at the "for"
      e.line = s.expr->line;
      e.column = s.expr->column;
    }
    throw;
  }
  List items;
  if (s.cond) {
    // The loop filter sees the loop target but not `loop` (jinja2 filters before counting).
    for (const Value& item : all) {
      step();
      Restore<decltype(scopes_)> guard(scopes_, scopes_);
      scopes_.push_back(std::make_shared<Scope>());
      assign(s.targets, item);
      if (eval(*s.cond).truthy()) items.push_back(item);
    }
  } else {
    items = std::move(all);
  }
  if (items.empty()) return exec(s.else_body, out);
  int64_t n = int64_t(items.size());
  ++loop_depth_;
  struct DepthGuard {
    int& d;
    ~DepthGuard() { --d; }
  } depth_guard{loop_depth_};
  for (int64_t i = 0; i < n; ++i) {
    step();
    Restore<decltype(scopes_)> guard(scopes_, scopes_);
    scopes_.push_back(std::make_shared<Scope>());
    assign(s.targets, items[size_t(i)]);
    Dict loop = {
        {"index", Value::from(i + 1)},
        {"index0", Value::from(i)},
        {"revindex", Value::from(n - i)},
        {"revindex0", Value::from(n - i - 1)},
        {"first", Value::from(i == 0)},
        {"last", Value::from(i == n - 1)},
        {"length", Value::from(n)},
        // depth counts recursive-loop levels in jinja2, so a plain loop, nested or not, is at depth 1.
        {"depth", Value::from(int64_t(1))},
        {"depth0", Value::from(int64_t(0))},
        {"previtem", i > 0 ? items[size_t(i - 1)] : Value::undefined("there is no previous item")},
        {"nextitem", i + 1 < n ? items[size_t(i + 1)] : Value::undefined("there is no next item")},
        {"cycle", Value::function([i](CallArgs& a) {
           if (a.positional.empty()) throw EvalError("no items for cycling given");
           return a.positional[size_t(i) % a.positional.size()];
         })},
    };
    scopes_.back()->insert_or_assign("loop", Value::from(std::move(loop)));
    Flow f = exec(s.body, out);
    if (f == Flow::Break) break;
  }
  return Flow::Normal;
}

Value Interpreter::define_macro(const Stmt& s) {
  // The macro sees the scopes around its definition as they are when it is called; weak pointers so the
  // scope holding the macro and the macro holding the scope do not keep each other alive.
  std::vector<std::weak_ptr<Scope>> closure(scopes_.begin(), scopes_.end());
  const Stmt* def = &s;
  return Value::function([this, def, closure](CallArgs& a) {
    if (a.positional.size() > def->params.size())
      throw EvalError("macro '" + def->text + "' takes not more than " + std::to_string(def->params.size()) +
                      " argument(s)");
    for (const auto& kv : a.keyword) {
      bool known = false;
      for (const auto& p : def->params) known = known || p.first == kv.first;
      if (!known) throw EvalError("macro '" + def->text + "' takes no keyword argument '" + kv.first + "'");
    }
    Depth calls(call_depth_, kMaxCallDepth, "macro call depth");
    std::vector<std::shared_ptr<Scope>> chain;
    for (const auto& w : closure)
      if (auto sp = w.lock()) chain.push_back(sp);
    chain.push_back(std::make_shared<Scope>());
    Restore<decltype(scopes_)> guard(scopes_, std::move(chain));
    int saved_depth = loop_depth_;
    loop_depth_ = 0;  // break/continue cannot reach a loop outside the macro
    struct DepthRestore {
      int& d;
      int v;
      ~DepthRestore() { d = v; }
    } depth_restore{loop_depth_, saved_depth};
    for (size_t i = 0; i < def->params.size(); ++i) {
      const auto& [name, dflt] = def->params[i];
      if (a.has(i, name)) {
        (*scopes_.back())[name] = a.get(i, name);
      } else {
        (*scopes_.back())[name] =
            dflt ? eval(*dflt)
                 : Value::undefined("parameter '" + name + "' of macro '" + def->text + "' was not given");
      }
    }
    std::string out;
    exec(def->body, out);
    return Value::from(std::move(out));
  });
}

CallArgs Interpreter::eval_args(const Expr& e, size_t first) {
  CallArgs a;
  for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
  for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v));
  return a;
}

Value Interpreter::eval(const Expr& e) {
  try {
    step();
    Depth depth(eval_depth_, kMaxEvalDepth, "evaluation depth", stack_base_);
    Value v = eval_node(e);
    if (v.is_string()) check_string_size(int64_t(v.str.size()));  // what filters and methods built
    return v;
  } catch (EvalError& err) {
    if (err.line == 0) {
      err.line = e.line;
      err.column = e.column;
    }
    throw;
  }
}

Value Interpreter::eval_compare(const Expr& e) {
  Value left = eval(*e.args[0]);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.args[i + 1]);
    const std::string& op = e.ops[i];
    bool r = op == "=="   ? equal(left, right)
             : op == "!=" ? !equal(left, right)
             : op == "<"  ? less(left, right)
             : op == "<=" ? !less(right, left)
             : op == ">"  ? less(right, left)
             : op == ">=" ? !less(left, right)
             : op == "in" ? contains(right, left)
                          : !contains(right, left);
    if (!r) return Value::from(false);
    left = std::move(right);
  }
  return Value::from(true);
}

Value Interpreter::eval_node(const Expr& e) {
  switch (e.kind) {
    case EK::Literal: return e.value;
    case EK::Name: return lookup(e.name);
    case EK::List:
    case EK::Tuple: {
      List l;
      for (const auto& x : e.args) l.push_back(eval(*x));
      return Value::from(std::move(l), e.kind == EK::Tuple);
    }
    case EK::Dict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i]);
        if (!k.is_string()) throw EvalError("dict keys must be strings here, got " + type_name(k));
        Value v = eval(*e.args[i + 1]);
        auto it = std::find_if(d.begin(), d.end(), [&](auto& kv) { return kv.first == k.str; });
        if (it != d.end())
          it->second = std::move(v);
        else
          d.emplace_back(k.str, std::move(v));
      }
      return Value::from(std::move(d));
    }
    case EK::Attr: return get_attr(eval(*e.args[0]), e.name);
    case EK::Item: {
      Value obj = eval(*e.args[0]);
      return get_item(obj, eval(*e.args[1]));
    }
    case EK::Slice: {
      Value obj = eval(*e.args[0]);
      auto part = [&](size_t i) { return e.args[i] ? eval(*e.args[i]) : Value::undefined(); };
      return slice(obj, part(1), part(2), part(3));
    }
    case EK::Call: {
      Value callee = eval(*e.args[0]);
      CallArgs a = eval_args(e, 1);
      if (callee.is_undefined()) undefined_error(callee);
      if (callee.kind != Value::Kind::Callable) throw EvalError("'" + type_name(callee) + "' object is not callable");
      return (*callee.fn)(a);
    }
    case EK::Filter: {
      Value target = eval(*e.args[0]);
      CallArgs a = eval_args(e, 1);
      a.what = "filter '" + e.name + "'";
      return apply_filter(e.name, target, a);
    }
    case EK::Test: {
      Value target = eval(*e.args[0]);
      CallArgs a = eval_args(e, 1);
      a.what = "test '" + e.name + "'";
      return Value::from(apply_test(e.name, target, a) != e.negated);
    }
    case EK::Unary: {
      Value v = eval(*e.args[0]);
      if (e.name == "not") return Value::from(!v.truthy());
      if (v.is_undefined()) undefined_error(v);
      if (!v.is_number()) throw EvalError("bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
      if (e.name == "+") return v.is_integral() ? Value::from(v.as_int()) : v;
      if (v.is_integral() && v.as_int() == INT64_MIN)
        throw EvalError("integer overflow: the result does not fit in 64 bits");
      return v.is_integral() ? Value::from(-v.as_int()) : Value::from(-v.number);
    }
    case EK::Binary: {
      Value a = eval(*e.args[0]);
      return binary_op(e.name, a, eval(*e.args[1]));
    }
    case EK::And: {
      Value a = eval(*e.args[0]);
      return a.truthy() ? eval(*e.args[1]) : a;
    }
    case EK::Or: {
      Value a = eval(*e.args[0]);
      return a.truthy() ? a : eval(*e.args[1]);
    }
    case EK::Compare: return eval_compare(e);
    case EK::Cond:
      if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
      return e.args[2] ? eval(*e.args[2]) : Value::undefined("the inline if had no else branch");
  }
  return Value::undefined();
}

}  // namespace soltrain::jinja
