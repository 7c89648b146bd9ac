#include "common/jinja/template.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/jinja/builtins.h"
#include "common/jinja/parser.h"
#include "common/jinja/text.h"
#include "common/status_macros.h"

namespace cleave::jinja {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

// The frames a name is looked up in, innermost last: the template's top level, then one
// per for loop or macro call.
struct Scope {
  std::vector<std::shared_ptr<Dict>> frames;
};

// Evaluation nested deeper than this (expressions, blocks and macro calls together) is
// refused, which bounds the stack a render takes.
constexpr int kMaxRecursion = 400;

absl::Status undefinedUse(const Value& v) {
  return absl::InvalidArgumentError(absl::StrCat("undefined value: ", v.undefinedName()));
}

// markupsafe's escape: & < > " ' as entities.
std::string htmlEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

absl::Status typeError(absl::string_view what) {
  return absl::InvalidArgumentError(std::string(what));
}

class Renderer {
 public:
  Renderer(const Dict& context, const RenderLimits& limits)
      : context_(context),
        limits_(limits),
        deadline_(std::chrono::steady_clock::now() + limits.max_time) {}

  ~Renderer() {
    // Namespaces may hold each other (`set ns.me = ns`), and frames the macros defined in
    // them (which hold the frames): emptied here, none outlives the render or takes a deep
    // chain of destructors with it.
    for (const auto& ns : namespaces_) ns->attributes.items.clear();
    for (const auto& frame : captured_) {
      frame->items.clear();
      frame->int_items.clear();
    }
    if (root_) root_->items.clear();
  }

  absl::StatusOr<std::string> run(const Body& body) {
    root_ = std::make_shared<Dict>();
    Scope scope{{root_}};
    std::string out;
    CLEAVE_RETURN_IF_ERROR(exec(body, scope, out).status());
    return out;
  }

 private:
  absl::Status step() {
    if (++steps_ > limits_.max_steps) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the template ran more than ", limits_.max_steps, " steps"));
    }
    if (steps_ % 4096 == 0 && std::chrono::steady_clock::now() > deadline_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the template ran longer than ", limits_.max_time.count(), " ms"));
    }
    return absl::OkStatus();
  }

  absl::Status append(std::string& out, absl::string_view s) const {
    if (out.size() + s.size() > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the template wrote more than ", limits_.max_output_bytes, " bytes"));
    }
    out.append(s.data(), s.size());
    return absl::OkStatus();
  }

  // A value the template builds may not outgrow what it may write.
  absl::Status checkSize(size_t bytes) const {
    if (bytes > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("the template built a value of more than ",
                                                       limits_.max_output_bytes, " bytes"));
    }
    return absl::OkStatus();
  }

  Value lookup(const Scope& scope, const std::string& name) {
    for (auto it = scope.frames.rbegin(); it != scope.frames.rend(); ++it) {
      if (const Value* v = (*it)->find(name)) return *v;
    }
    if (const Value* v = context_.find(name)) return *v;
    if (name == "namespace") return namespaceFunction();
    if (const Value* v = globals().find(name)) return *v;
    return Value::undefined(absl::StrCat("'", name, "' is undefined"));
  }

  // Counts one level of evaluation while alive; `ok` is false past kMaxRecursion.
  struct Nesting {
    explicit Nesting(int& level) : level(level), ok(++level <= kMaxRecursion) {}
    ~Nesting() { --level; }
    int& level;
    bool ok;
  };
  static absl::Status tooDeep() {
    return absl::ResourceExhaustedError(
        absl::StrCat("the template nested evaluation deeper than ", kMaxRecursion, " levels"));
  }

  absl::StatusOr<Flow> exec(const Body& body, Scope& scope, std::string& out) {
    Nesting nesting(recursion_);
    if (!nesting.ok) return tooDeep();
    for (const NodePtr& node : body) {
      absl::StatusOr<Flow> flow = execNode(*node, scope, out);
      if (!flow.ok()) {
        const absl::Status& s = flow.status();
        if (absl::StartsWith(s.message(), "line ") ||
            absl::StartsWith(s.message(), kRaisedPrefix)) {
          return s;
        }
        return absl::Status(s.code(), absl::StrCat("line ", node->line, ": ", s.message()));
      }
      if (*flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  absl::Status assign(Scope& scope, const std::vector<std::string>& targets, const Value& value) {
    if (targets.size() == 1) {
      scope.frames.back()->set(targets[0], value);
      return absl::OkStatus();
    }
    if (!value.isList() || value.asList().size() != targets.size()) {
      return typeError(
          absl::StrCat("cannot unpack ", value.typeName(), " into ", targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i)
      scope.frames.back()->set(targets[i], value.asList()[i]);
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> execNode(const Node& node, Scope& scope, std::string& out) {
    CLEAVE_RETURN_IF_ERROR(step());
    switch (node.kind) {
      case Node::Kind::kText: CLEAVE_RETURN_IF_ERROR(append(out, node.text)); return Flow::kNormal;
      case Node::Kind::kPrint: {
        CLEAVE_ASSIGN_OR_RETURN(Value v, eval(*node.expr, scope));
        CLEAVE_RETURN_IF_ERROR(append(out, v.str()));
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& [condition, body] : node.branches) {
          bool taken = condition == nullptr;
          if (!taken) {
            CLEAVE_ASSIGN_OR_RETURN(Value c, eval(*condition, scope));
            taken = c.truthy();
          }
          if (taken) return exec(body, scope, out);
        }
        return Flow::kNormal;
      case Node::Kind::kFor: return execFor(node, scope, out);
      case Node::Kind::kSet: {
        CLEAVE_ASSIGN_OR_RETURN(Value v, eval(*node.expr, scope));
        if (node.attribute.empty()) {
          CLEAVE_RETURN_IF_ERROR(assign(scope, node.targets, v));
          return Flow::kNormal;
        }
        const Value target = lookup(scope, node.targets[0]);
        if (!target.isNamespace()) {
          return typeError(absl::StrCat("cannot assign attribute '", node.attribute, "' of '",
                                        node.targets[0], "': it is not a namespace"));
        }
        if (node.attribute[0] == '_') {
          return typeError(
              absl::StrCat("namespace attribute '", node.attribute, "' starts with an underscore"));
        }
        target.asNamespace().attributes.set(node.attribute, std::move(v));
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        CLEAVE_RETURN_IF_ERROR(exec(node.body, scope, captured).status());
        CLEAVE_RETURN_IF_ERROR(assign(scope, node.targets, Value(std::move(captured))));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro: {
        // The macro reads the frames around its definition (loop variables, sets) when it
        // is called, as Jinja's closures do.
        std::vector<std::shared_ptr<Dict>> closure(scope.frames.begin() + 1, scope.frames.end());
        captured_.insert(captured_.end(), closure.begin(), closure.end());
        scope.frames.back()->set(node.name, macro(node, std::move(closure)));
        return Flow::kNormal;
      }
      case Node::Kind::kBreak: return Flow::kBreak;
      case Node::Kind::kContinue: return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  // A for loop's frame: fresh for every pass (a `set` in the body starts from the outer value
  // each time, as Jinja scopes it) and gone after the loop.
  struct Frame {
    explicit Frame(Scope& scope) : scope(scope), vars(std::make_shared<Dict>()) {
      scope.frames.push_back(vars);
    }
    ~Frame() { scope.frames.pop_back(); }
    Scope& scope;
    std::shared_ptr<Dict> vars;
  };

  absl::StatusOr<Flow> execFor(const Node& node, Scope& scope, std::string& out) {
    CLEAVE_ASSIGN_OR_RETURN(Value iterable, eval(*node.expr, scope));
    CLEAVE_ASSIGN_OR_RETURN(List items, iterate(iterable));
    if (node.filter != nullptr) {
      List kept;
      for (const Value& item : items) {
        Frame frame(scope);
        CLEAVE_RETURN_IF_ERROR(assign(scope, node.targets, item));
        CLEAVE_ASSIGN_OR_RETURN(Value keep, eval(*node.filter, scope));
        if (keep.truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      CLEAVE_RETURN_IF_ERROR(step());
      Frame frame(scope);
      Dict loop;
      loop.set("index", Value(i + 1));
      loop.set("index0", Value(i));
      loop.set("revindex", Value(n - i));
      loop.set("revindex0", Value(n - i - 1));
      loop.set("first", Value(i == 0));
      loop.set("last", Value(i == n - 1));
      loop.set("length", Value(n));
      if (i > 0) loop.set("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < n) loop.set("nextitem", items[static_cast<size_t>(i + 1)]);
      loop.set("cycle", Value::function([i](const CallArgs& args) -> absl::StatusOr<Value> {
                 if (args.positional.empty())
                   return typeError("loop.cycle needs at least one value");
                 return args.positional[static_cast<size_t>(i) % args.positional.size()];
               }));
      frame.vars->set("loop", Value(std::move(loop)));
      CLEAVE_RETURN_IF_ERROR(assign(scope, node.targets, items[static_cast<size_t>(i)]));
      CLEAVE_ASSIGN_OR_RETURN(Flow flow, exec(node.body, scope, out));
      if (flow == Flow::kBreak) break;
    }
    if (n == 0 && !node.else_body.empty()) {
      Frame frame(scope);
      CLEAVE_RETURN_IF_ERROR(exec(node.else_body, scope, out).status());
    }
    return Flow::kNormal;
  }

  // namespace(...) as the global makes it, remembered so the render can empty it at its end.
  Value namespaceFunction() {
    return Value::function([this](const CallArgs& args) -> absl::StatusOr<Value> {
      CLEAVE_ASSIGN_OR_RETURN(Value ns, globals().find("namespace")->asFunction()(args));
      namespaces_.push_back(&ns.asNamespace());
      held_.push_back(ns);
      return ns;
    });
  }

  Value macro(const Node& node, std::vector<std::shared_ptr<Dict>> closure) {
    return Value::function([this, &node, closure](const CallArgs& args) -> absl::StatusOr<Value> {
      if (depth_ >= limits_.max_call_depth) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "macro '", node.name, "' nested deeper than ", limits_.max_call_depth, " calls"));
      }
      if (args.positional.size() > node.params.size()) {
        return typeError(absl::StrCat("macro '", node.name, "' takes ", node.params.size(),
                                      " arguments, got ", args.positional.size()));
      }
      Scope scope{{root_}};
      scope.frames.insert(scope.frames.end(), closure.begin(), closure.end());
      scope.frames.push_back(std::make_shared<Dict>());
      Dict& frame = *scope.frames.back();
      for (size_t i = 0; i < node.params.size(); ++i) {
        const auto& [name, fallback] = node.params[i];
        if (i < args.positional.size()) {
          frame.set(name, args.positional[i]);
          continue;
        }
        const Value* given = nullptr;
        for (const auto& [k, v] : args.keyword) {
          if (k == name) given = &v;
        }
        if (given != nullptr) {
          frame.set(name, *given);
        } else if (fallback != nullptr) {
          CLEAVE_ASSIGN_OR_RETURN(Value v, eval(*fallback, scope));
          frame.set(name, std::move(v));
        } else {
          frame.set(name, Value::undefined(absl::StrCat("'", name, "' is undefined")));
        }
      }
      for (const auto& [k, v] : args.keyword) {
        bool known = false;
        for (const auto& p : node.params) known = known || p.first == k;
        if (!known) {
          return typeError(
              absl::StrCat("macro '", node.name, "' takes no keyword argument '", k, "'"));
        }
      }
      ++depth_;
      std::string out;
      absl::StatusOr<Flow> flow = exec(node.body, scope, out);
      --depth_;
      CLEAVE_RETURN_IF_ERROR(flow.status());
      return Value(std::move(out));
    });
  }

  absl::StatusOr<CallArgs> arguments(const Expr& e, size_t first, Scope& scope) {
    CallArgs args;
    for (size_t i = first; i < e.children.size(); ++i) {
      CLEAVE_ASSIGN_OR_RETURN(Value v, eval(*e.children[i], scope));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [k, expr] : e.keywords) {
      CLEAVE_ASSIGN_OR_RETURN(Value v, eval(*expr, scope));
      args.keyword.emplace_back(k, std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> eval(const Expr& e, Scope& scope) {
    Nesting nesting(recursion_);
    if (!nesting.ok) return tooDeep();
    CLEAVE_ASSIGN_OR_RETURN(Value v, evalNode(e, scope));
    if (v.depth() > limits_.max_value_depth) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the template built lists or dicts nested deeper than ", limits_.max_value_depth));
    }
    // A value printing it could not write (lists sharing items multiply) is refused now.
    if (v.weight() > static_cast<int64_t>(limits_.max_output_bytes)) {
      return absl::ResourceExhaustedError(absl::StrCat("the template built a value larger than ",
                                                       limits_.max_output_bytes, " bytes"));
    }
    return v;
  }

  absl::StatusOr<Value> evalNode(const Expr& e, Scope& scope) {
    CLEAVE_RETURN_IF_ERROR(step());
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: return lookup(scope, e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        for (const ExprPtr& c : e.children) {
          CLEAVE_ASSIGN_OR_RETURN(Value v, eval(*c, scope));
          items.push_back(std::move(v));
        }
        return e.kind == Expr::Kind::kTuple ? Value::tuple(std::move(items))
                                            : Value(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          CLEAVE_ASSIGN_OR_RETURN(Value k, eval(*e.children[i], scope));
          CLEAVE_ASSIGN_OR_RETURN(Value v, eval(*e.children[i + 1], scope));
          if (k.isInt()) {
            dict.setInt(k.asInt(), std::move(v));
          } else if (k.isString()) {
            dict.set(k.asString(), std::move(v));
          } else {
            return typeError("dict keys must be strings or integers");
          }
        }
        return Value(std::move(dict));
      }
      case Expr::Kind::kAttribute: {
        CLEAVE_ASSIGN_OR_RETURN(Value object, eval(*e.children[0], scope));
        if (object.isUndefined()) return undefinedUse(object);
        return getAttribute(object, e.name);
      }
      case Expr::Kind::kItem: {
        CLEAVE_ASSIGN_OR_RETURN(Value object, eval(*e.children[0], scope));
        if (object.isUndefined()) return undefinedUse(object);
        CLEAVE_ASSIGN_OR_RETURN(Value key, eval(*e.children[1], scope));
        return getItem(object, key);
      }
      case Expr::Kind::kSlice: return slice(e, scope);
      case Expr::Kind::kCall: {
        CLEAVE_ASSIGN_OR_RETURN(Value callee, eval(*e.children[0], scope));
        if (callee.isUndefined()) return undefinedUse(callee);
        if (!callee.isFunction()) {
          return typeError(absl::StrCat("'", callee.typeName(), "' object is not callable"));
        }
        CLEAVE_ASSIGN_OR_RETURN(CallArgs args, arguments(e, 1, scope));
        return callee.asFunction()(args);
      }
      case Expr::Kind::kFilter: {
        CLEAVE_ASSIGN_OR_RETURN(Value input, eval(*e.children[0], scope));
        CLEAVE_ASSIGN_OR_RETURN(CallArgs args, arguments(e, 1, scope));
        return applyFilter(e.name, input, args);
      }
      case Expr::Kind::kTest: {
        CLEAVE_ASSIGN_OR_RETURN(Value input, eval(*e.children[0], scope));
        CLEAVE_ASSIGN_OR_RETURN(CallArgs args, arguments(e, 1, scope));
        CLEAVE_ASSIGN_OR_RETURN(bool passed, applyTest(e.name, input, args));
        return Value(passed != e.negated);
      }
      case Expr::Kind::kUnary: {
        CLEAVE_ASSIGN_OR_RETURN(Value v, eval(*e.children[0], scope));
        if (e.name == "not") return Value(!v.truthy());
        if (v.isUndefined()) return undefinedUse(v);
        if (!v.isNumber()) {
          return typeError(
              absl::StrCat("bad operand type for unary ", e.name, ": '", v.typeName(), "'"));
        }
        if (e.name == "+") return v.isFloat() ? v : Value(v.asInt());
        if (v.isFloat()) return Value(-v.asDouble());
        if (v.asInt() == INT64_MIN) return typeError("integer overflow");
        return Value(-v.asInt());
      }
      case Expr::Kind::kBinary: return binary(e, scope);
      case Expr::Kind::kCompare: return chain(e, scope);
      case Expr::Kind::kConditional: {
        CLEAVE_ASSIGN_OR_RETURN(Value c, eval(*e.children[1], scope));
        if (c.truthy()) return eval(*e.children[0], scope);
        if (e.children[2] == nullptr) return Value::undefined("the conditional expression's else");
        return eval(*e.children[2], scope);
      }
    }
    return Value();
  }

  absl::StatusOr<Value> slice(const Expr& e, Scope& scope) {
    CLEAVE_ASSIGN_OR_RETURN(Value object, eval(*e.children[0], scope));
    if (object.isUndefined()) return undefinedUse(object);
    std::optional<int64_t> bound[3];
    for (int i = 0; i < 3; ++i) {
      if (e.children[static_cast<size_t>(i) + 1] == nullptr) continue;
      CLEAVE_ASSIGN_OR_RETURN(Value v, eval(*e.children[static_cast<size_t>(i) + 1], scope));
      if (v.isNone()) continue;
      if (!v.isInt() && !v.isBool()) return typeError("slice indices must be integers or None");
      bound[i] = v.asInt();
    }
    const int64_t step = bound[2].value_or(1);
    if (step == 0) return typeError("slice step cannot be zero");
    std::u32string chars;
    int64_t n = 0;
    if (object.isString()) {
      chars = text::decode(object.asString());
      n = static_cast<int64_t>(chars.size());
    } else if (object.isList()) {
      n = static_cast<int64_t>(object.asList().size());
    } else {
      return typeError(absl::StrCat("'", object.typeName(), "' object is not subscriptable"));
    }
    const auto clamp = [&](std::optional<int64_t> v, int64_t fallback, int64_t low, int64_t high) {
      if (!v) return fallback;
      int64_t x = *v < 0 ? *v + n : *v;
      return std::clamp(x, low, high);
    };
    std::vector<int64_t> picked;
    // Indices stay within [-1, n], so a huge step ends the walk instead of overflowing.
    if (step > 0) {
      const int64_t start = clamp(bound[0], 0, 0, n), stop = clamp(bound[1], n, 0, n);
      for (int64_t i = start; i < stop; i = step >= stop - i ? stop : i + step) picked.push_back(i);
    } else {
      const int64_t start = clamp(bound[0], n - 1, -1, n - 1),
                    stop = clamp(bound[1], -1, -1, n - 1);
      for (int64_t i = start; i > stop; i = step <= stop - i ? stop : i + step) picked.push_back(i);
    }
    if (object.isString()) {
      std::u32string out;
      for (int64_t i : picked) out += chars[static_cast<size_t>(i)];
      return Value(text::encode(out));
    }
    List out;
    for (int64_t i : picked) out.push_back(object.asList()[static_cast<size_t>(i)]);
    return Value(std::move(out));
  }

  // a OP b for the comparison operators (==, !=, <, <=, >, >=, in, not in).
  static absl::StatusOr<Value> compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return Value(equal(a, b));
    if (op == "!=") return Value(!equal(a, b));
    if (op == "in" || op == "not in") {
      if (b.isString() && !a.isString()) {
        return typeError(
            absl::StrCat("'in <string>' requires string as left operand, not ", a.typeName()));
      }
      CLEAVE_ASSIGN_OR_RETURN(bool found, applyTest("in", a, CallArgs{{b}, {}}));
      return Value(found != (op == "not in"));
    }
    if (a.isUndefined()) return undefinedUse(a);
    if (b.isUndefined()) return undefinedUse(b);
    // a > b is b < a; a <= b is not b < a; a >= b is not a < b.
    const bool swapped = op == ">" || op == "<=";
    CLEAVE_ASSIGN_OR_RETURN(bool r, swapped ? less(b, a) : less(a, b));
    return Value(op.size() == 2 ? !r : r);
  }

  absl::StatusOr<Value> chain(const Expr& e, Scope& scope) {
    CLEAVE_ASSIGN_OR_RETURN(Value left, eval(*e.children[0], scope));
    for (size_t i = 0; i < e.ops.size(); ++i) {
      CLEAVE_ASSIGN_OR_RETURN(Value right, eval(*e.children[i + 1], scope));
      CLEAVE_ASSIGN_OR_RETURN(Value holds, compare(e.ops[i], left, right));
      if (!holds.truthy()) return Value(false);
      left = std::move(right);
    }
    return Value(true);
  }

  absl::StatusOr<Value> binary(const Expr& e, Scope& scope) {
    const std::string& op = e.name;
    CLEAVE_ASSIGN_OR_RETURN(Value a, eval(*e.children[0], scope));
    if (op == "and") return a.truthy() ? eval(*e.children[1], scope) : a;
    if (op == "or") return a.truthy() ? a : eval(*e.children[1], scope);
    CLEAVE_ASSIGN_OR_RETURN(Value b, eval(*e.children[1], scope));
    if (op == "==" || op == "!=") return compare(op, a, b);
    if (op == "~") {
      std::string left = a.str(), right = b.str();
      CLEAVE_RETURN_IF_ERROR(checkSize(left.size() + right.size()));
      return Value(std::move(left) + right);
    }
    if (op == "in" || op == "not in" || op == "<" || op == ">" || op == "<=" || op == ">=") {
      return compare(op, a, b);
    }
    if (a.isUndefined()) return undefinedUse(a);
    if (b.isUndefined()) return undefinedUse(b);
    if (op == "+") {
      if (a.isString() && b.isString()) {
        if (a.isMarkup() || b.isMarkup()) {
          // Markup + str escapes the str, and the sum is Markup.
          std::string joined = (a.isMarkup() ? a.asString() : htmlEscape(a.asString())) +
                               (b.isMarkup() ? b.asString() : htmlEscape(b.asString()));
          CLEAVE_RETURN_IF_ERROR(checkSize(joined.size()));
          return Value::markup(std::move(joined));
        }
        CLEAVE_RETURN_IF_ERROR(checkSize(a.asString().size() + b.asString().size()));
        return Value(a.asString() + b.asString());
      }
      if (a.isList() && b.isList()) {
        CLEAVE_RETURN_IF_ERROR(checkSize((a.asList().size() + b.asList().size()) * sizeof(Value)));
        List joined = a.asList();
        joined.insert(joined.end(), b.asList().begin(), b.asList().end());
        return Value(std::move(joined));
      }
    }
    if (op == "*" && ((a.isString() && (b.isInt() || b.isBool())) ||
                      (b.isString() && (a.isInt() || a.isBool())))) {
      const std::string& s = a.isString() ? a.asString() : b.asString();
      const int64_t times = a.isString() ? b.asInt() : a.asInt();
      if (s.empty() || times <= 0) return Value(std::string());
      if (static_cast<double>(s.size()) * static_cast<double>(times) >
          static_cast<double>(limits_.max_output_bytes)) {
        return absl::ResourceExhaustedError("string repetition larger than the output limit");
      }
      std::string out;
      for (int64_t i = 0; i < times; ++i) out += s;
      return Value(std::move(out));
    }
    if (!a.isNumber() || !b.isNumber()) {
      if (op == "%" && a.isString())
        return typeError("string formatting with '%' is not supported");
      return typeError(absl::StrCat("unsupported operand type(s) for ", op, ": '", a.typeName(),
                                    "' and '", b.typeName(), "'"));
    }
    return arithmetic(op, a, b);
  }

  static absl::StatusOr<Value> arithmetic(const std::string& op, const Value& a, const Value& b) {
    const bool floats = a.isFloat() || b.isFloat();
    if (op == "/") {
      if (b.asDouble() == 0) return typeError("division by zero");
      return Value(a.asDouble() / b.asDouble());
    }
    if (floats) {
      const double x = a.asDouble(), y = b.asDouble();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "**") {
        if (x == 0 && y < 0) return typeError("0.0 cannot be raised to a negative power");
        return Value(std::pow(x, y));
      }
      if (y == 0) return typeError("float division by zero");
      // CPython's float divmod: the remainder from fmod, the quotient from it.
      double mod = std::fmod(x, y);
      double div = (x - mod) / y;
      if (mod != 0) {
        if ((y < 0) != (mod < 0)) {
          mod += y;
          div -= 1.0;
        }
      } else {
        mod = std::copysign(0.0, y);
      }
      double floordiv = std::copysign(0.0, x / y);
      if (div != 0) {
        floordiv = std::floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
      }
      return Value(op == "//" ? floordiv : mod);
    }
    const int64_t x = a.asInt(), y = b.asInt();
    int64_t r = 0;
    bool overflow = false;
    if (op == "+") overflow = __builtin_add_overflow(x, y, &r);
    if (op == "-") overflow = __builtin_sub_overflow(x, y, &r);
    if (op == "*") overflow = __builtin_mul_overflow(x, y, &r);
    if (op == "**") {
      if (y < 0 && x == 0) return typeError("0 cannot be raised to a negative power");
      if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
      // By squaring: at most 64 rounds before |r| overflows (|x| <= 1 never does).
      r = 1;
      int64_t base = x;
      for (int64_t e = y; e > 0 && !overflow; e >>= 1) {
        if (e & 1) overflow = __builtin_mul_overflow(r, base, &r);
        if (e > 1 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
      }
    }
    if (op == "//" || op == "%") {
      if (y == 0) return typeError("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) return typeError("integer overflow");
      // Floor division and a remainder with the divisor's sign, without overflow.
      const int64_t m = x % y;
      const bool adjust = m != 0 && ((m < 0) != (y < 0));
      r = op == "//" ? x / y - (adjust ? 1 : 0) : m + (adjust ? y : 0);
    }
    if (overflow) return typeError("integer overflow");
    return Value(r);
  }

  const Dict& context_;
  const RenderLimits& limits_;
  const std::chrono::steady_clock::time_point deadline_;
  std::shared_ptr<Dict> root_;
  std::vector<std::shared_ptr<Dict>> captured_;  // frames macros hold, emptied at the end
  int recursion_ = 0;
  std::vector<Namespace*> namespaces_;  // every namespace this render made
  std::vector<Value> held_;             // ...kept alive until they are emptied
  int64_t steps_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Template> Template::parse(const std::string& source) {
  CLEAVE_ASSIGN_OR_RETURN(Body body, jinja::parse(source));
  return Template(std::make_shared<const Body>(std::move(body)));
}

absl::StatusOr<std::string> Template::render(const Dict& context,
                                             const RenderLimits& limits) const {
  return Renderer(context, limits).run(*body_);
}

}  // namespace cleave::jinja
