// A compiled Jinja template, rendered the way Python jinja2 renders it in Hugging Face's
// apply_chat_template (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
// default Undefined, raise_exception/strftime_now globals, tojson without HTML escaping).
//
//   jinja::Template t("{% for m in messages %}{{ m.content }}{% endfor %}");
//   std::string s = t.render(context);  // context: a dict Value
//
// Unsupported syntax fails at construction, unsupported runtime features and template errors
// (raise_exception, undefined access, type errors) fail in render; both throw astrai::Error
// naming the feature and the template line.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/parser.h"
#include "tokenizer/jinja/value.h"

namespace astrai::tokenizer::jinja {

class Template {
 public:
  explicit Template(const std::string& source, const LexOptions& options = {});
  // Renders with `context` (a dict; its keys become template variables) on top of the globals
  // (range, dict, namespace, raise_exception, strftime_now).
  std::string render(const Value& context) const;

 private:
  std::shared_ptr<const Program> program_;
};

struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
  const Value* lookup(const std::string& name) const;
};

// Evaluates a Program. One per render; builtins use it to call back into template callables.
class Interpreter {
 public:
  explicit Interpreter(std::shared_ptr<const Program> program);
  std::string render(const Value& context);

  Value call(const Value& callee, Args& args, int line);

  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec(const Body& body, const std::shared_ptr<Frame>& frame, std::string& out);
  Flow exec_stmt(const Stmt& s, const std::shared_ptr<Frame>& frame, std::string& out);
  void exec_for(const Stmt& s, const std::shared_ptr<Frame>& frame, std::string& out);
  Value eval(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_inner(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_filter_chain(const Expr* e, const Value& input, const std::shared_ptr<Frame>& frame);
  void eval_args(const Expr& e, const std::shared_ptr<Frame>& frame, Args& args);
  // A macro (or a call block's caller) as a callable closing over the defining frame.
  Value make_macro(const Stmt& s, const std::shared_ptr<Frame>& closure);
  void assign(const std::vector<std::string>& names, const Value& v, Frame& frame, int line);

  int call_depth_ = 0;  // nested macro calls

 private:
  std::shared_ptr<const Program> program_;
};

// Python-style helpers the evaluator and builtins share.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// Iterates like Python's iter(): list items, dict keys, string characters; Undefined is empty.
std::vector<Value> iterate(const Value& v);

}  // namespace astrai::tokenizer::jinja
