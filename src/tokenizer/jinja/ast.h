// Jinja template syntax tree. Every node keeps its template line for error messages.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace astrai::tokenizer::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // children
    kTuple,      // children
    kDict,       // children: key0, value0, key1, value1, ...
    kGetAttr,    // children[0].name
    kGetItem,    // children[0][children[1]]
    kSlice,      // children[0][a:b:c]; children[1..3] may be null
    kCall,       // children[0](args)
    kFilter,     // children[0] | name(args); children[0] null inside {% filter %}
    kTest,       // children[0] is [not] name(args)
    kUnary,      // op children[0]: "-", "+", "not"
    kBinary,     // children[0] op children[1]: + - * / // % ** ~ and or
    kCompare,    // children[0] ops[0] children[1] ops[1] children[2] ...
    kCondExpr,   // children[1] if children[0] else children[2] (children[2] may be null)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;             // kName, kGetAttr, kFilter, kTest; op for kUnary/kBinary
  std::vector<ExprPtr> children;
  std::vector<ExprPtr> args;    // call/filter/test arguments: positional then keyword
  std::vector<std::string> kwnames;  // names of the last kwnames.size() args
  std::vector<std::string> ops;      // kCompare operators
  bool negated = false;              // kTest with `is not`
  bool unknown = false;              // kFilter/kTest naming no filter/test we know
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conds[i] → bodies[i]; else_body
    kFor,          // targets in expr [if cond] body else_body
    kSet,          // target(s) = expr; target may be ns.attr (attr non-empty)
    kSetBlock,     // {% set x %}body{% endset %} with optional filter expr (filter chain)
    kMacro,        // name(params = defaults) body
    kCallBlock,    // {% call(params) expr %} body
    kFilterBlock,  // {% filter f %} body
    kWith,         // {% with a = x %} body
    kBreak,
    kContinue,
    kScope,        // body in place ({% generation %})
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::string> targets;  // loop/set targets, macro params, with names
  std::string attr;                  // kSet to `ns.attr`
  std::vector<ExprPtr> defaults;     // macro param defaults (null when none); with values
  std::string name;                  // macro name
};

// A parsed template: the statement list.
struct Program {
  Body body;
};

}  // namespace astrai::tokenizer::jinja
