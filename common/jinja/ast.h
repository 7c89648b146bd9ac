// The parsed form of a template: statements (Node) over expressions (Expr).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/jinja/value.h"

namespace cleave::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // literal
    kName,       // name
    kList,       // children: items
    kTuple,      // children: items (a list at run time)
    kDict,       // children: key, value, key, value...
    kAttribute,  // children[0].name
    kItem,       // children[0][children[1]]
    kSlice,      // children[0][children[1]:children[2]:children[3]], each bound may be null
    kCall,       // children[0](children[1..], keywords)
    kFilter,     // children[0] | name(children[1..], keywords)
    kTest,       // children[0] is [not] name(children[1..])
    kUnary,      // name ("-", "+", "not") children[0]
    kBinary,     // children[0] name children[1]; name also "and", "or", "in", "not in"
    kCompare,  // children[0] ops[0] children[1] ops[1] children[2]...: Python's chained comparison
    kConditional,  // children[0] if children[1] else children[2] (null: undefined)
  };
  Kind kind;
  int line = 0;
  int depth = 1;  // of the tree below this node, this node included
  Value literal;
  std::string name;
  bool negated = false;  // kTest: `is not`
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;  // kCompare
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,      // text
    kPrint,     // {{ expr }}
    kIf,        // branches (a null condition is the else)
    kFor,       // for targets in expr [if filter]: body [else: else_body]
    kSet,       // set targets = expr, or set targets[0].attribute = expr
    kSetBlock,  // set targets[0]: body
    kMacro,     // macro name(params): body
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attribute;                                // kSet on a namespace
  std::string name;                                     // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: name, default (may be null)
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
};

}  // namespace cleave::jinja
