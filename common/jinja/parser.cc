#include "common/jinja/parser.h"

#include <algorithm>
#include <initializer_list>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/jinja/builtins.h"
#include "common/jinja/lexer.h"
#include "common/status_macros.h"

namespace cleave::jinja {
namespace {

// Deeper nesting than this (statements, or expressions in brackets) is refused rather than
// recursed into; so is an expression tree deeper than kMaxTreeDepth (`a + b + c ...`).
constexpr int kMaxDepth = 100;
constexpr int kMaxTreeDepth = 128;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<Body> run() {
    Body body;
    std::string stop;
    CLEAVE_RETURN_IF_ERROR(parseBody({}, body, stop));
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const {
    return tokens_[std::min(at_ + ahead, tokens_.size() - 1)];
  }
  const Token& next() { return tokens_[std::min(at_++, tokens_.size() - 1)]; }
  bool isOp(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kOperator && peek(ahead).text == op;
  }
  bool isName(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kName && peek(ahead).text == name;
  }
  absl::Status error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("line ", peek().line, ": ", what));
  }
  std::string describe(const Token& t) const {
    switch (t.kind) {
      case TokenKind::kEnd: return "the end of the template";
      case TokenKind::kBlockClose: return "'%}'";
      case TokenKind::kPrintClose: return "'}}'";
      case TokenKind::kText: return "text";
      case TokenKind::kString: return "a string";
      default: return absl::StrCat("'", t.text, "'");
    }
  }
  absl::Status expectOp(const char* op) {
    if (!isOp(op)) return error(absl::StrCat("expected '", op, "', found ", describe(peek())));
    ++at_;
    return absl::OkStatus();
  }
  absl::Status expectBlockClose() {
    if (peek().kind != TokenKind::kBlockClose) {
      return error(absl::StrCat("expected '%}', found ", describe(peek())));
    }
    ++at_;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> expectName() {
    if (peek().kind != TokenKind::kName) {
      return error(absl::StrCat("expected a name, found ", describe(peek())));
    }
    return next().text;
  }

  // Statements until a `{% name` with name in `stops` (consumed up to the name, which is
  // returned in `stop`) or the end (only where `stops` is empty).
  absl::Status parseBody(const std::set<std::string>& stops, Body& body, std::string& stop) {
    if (++depth_ > kMaxDepth) return error("blocks nested too deeply");
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::kEnd) {
        if (stops.empty()) break;
        std::string wanted;
        for (const auto& s : stops) wanted += (wanted.empty() ? "'" : " or '") + s + "'";
        return error(absl::StrCat("unexpected end of template: expected ", wanted));
      }
      if (t.kind == TokenKind::kText) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kText;
        node->line = t.line;
        node->text = next().text;
        body.push_back(std::move(node));
      } else if (t.kind == TokenKind::kPrintOpen) {
        ++at_;
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kPrint;
        node->line = t.line;
        CLEAVE_ASSIGN_OR_RETURN(node->expr, parseTupleOrExpression());
        if (peek().kind != TokenKind::kPrintClose) {
          return error(absl::StrCat("expected '}}', found ", describe(peek())));
        }
        ++at_;
        body.push_back(std::move(node));
      } else if (t.kind == TokenKind::kBlockOpen) {
        ++at_;
        CLEAVE_ASSIGN_OR_RETURN(std::string name, expectName());
        if (stops.count(name)) {
          stop = name;
          break;
        }
        CLEAVE_RETURN_IF_ERROR(parseStatement(name, t.line, body));
      } else {
        return error(absl::StrCat("unexpected ", describe(t)));
      }
    }
    --depth_;
    return absl::OkStatus();
  }

  absl::Status parseStatement(const std::string& name, int line, Body& body) {
    auto node = std::make_unique<Node>();
    node->line = line;
    std::string stop;
    if (name == "if") {
      node->kind = Node::Kind::kIf;
      CLEAVE_ASSIGN_OR_RETURN(ExprPtr condition, parseExpression());
      // As Jinja: an unknown filter or test directly inside an if fails only when reached.
      Soft soft(*this, true);
      while (true) {
        CLEAVE_RETURN_IF_ERROR(expectBlockClose());
        Body branch;
        CLEAVE_RETURN_IF_ERROR(parseBody({"elif", "else", "endif"}, branch, stop));
        node->branches.emplace_back(std::move(condition), std::move(branch));
        if (stop == "endif") break;
        if (stop == "else") {
          CLEAVE_RETURN_IF_ERROR(expectBlockClose());
          Body last;
          CLEAVE_RETURN_IF_ERROR(parseBody({"endif"}, last, stop));
          node->branches.emplace_back(nullptr, std::move(last));
          break;
        }
        CLEAVE_ASSIGN_OR_RETURN(condition, parseExpression());
      }
    } else if (name == "for") {
      node->kind = Node::Kind::kFor;
      CLEAVE_ASSIGN_OR_RETURN(node->targets, parseTargets());
      if (!isName("in")) return error(absl::StrCat("expected 'in', found ", describe(peek())));
      ++at_;
      CLEAVE_ASSIGN_OR_RETURN(node->expr, parseExpression(/*with_conditional=*/false));
      if (isName("if")) {
        ++at_;
        CLEAVE_ASSIGN_OR_RETURN(node->filter, parseExpression(/*with_conditional=*/false));
      }
      if (isName("recursive")) return error("recursive loops are not supported");
      CLEAVE_RETURN_IF_ERROR(expectBlockClose());
      Soft strict(*this, false);
      ++loops_;
      CLEAVE_RETURN_IF_ERROR(parseBody({"else", "endfor"}, node->body, stop));
      --loops_;
      if (stop == "else") {
        CLEAVE_RETURN_IF_ERROR(expectBlockClose());
        CLEAVE_RETURN_IF_ERROR(parseBody({"endfor"}, node->else_body, stop));
      }
    } else if (name == "set") {
      CLEAVE_ASSIGN_OR_RETURN(node->targets, parseTargets());
      if (node->targets.size() == 1 && isOp(".")) {
        ++at_;
        CLEAVE_ASSIGN_OR_RETURN(node->attribute, expectName());
      }
      if (isOp("=")) {
        ++at_;
        node->kind = Node::Kind::kSet;
        CLEAVE_ASSIGN_OR_RETURN(node->expr, parseTupleOrExpression());
      } else {
        if (node->targets.size() != 1 || !node->attribute.empty()) {
          return error("a block 'set' assigns one name");
        }
        node->kind = Node::Kind::kSetBlock;
        CLEAVE_RETURN_IF_ERROR(expectBlockClose());
        CLEAVE_RETURN_IF_ERROR(parseBody({"endset"}, node->body, stop));
      }
    } else if (name == "macro") {
      node->kind = Node::Kind::kMacro;
      CLEAVE_ASSIGN_OR_RETURN(node->name, expectName());
      CLEAVE_RETURN_IF_ERROR(expectOp("("));
      while (!isOp(")")) {
        CLEAVE_ASSIGN_OR_RETURN(std::string param, expectName());
        ExprPtr fallback;
        if (isOp("=")) {
          ++at_;
          CLEAVE_ASSIGN_OR_RETURN(fallback, parseExpression());
        }
        node->params.emplace_back(std::move(param), std::move(fallback));
        if (!isOp(",")) break;
        ++at_;
      }
      CLEAVE_RETURN_IF_ERROR(expectOp(")"));
      CLEAVE_RETURN_IF_ERROR(expectBlockClose());
      const int loops = loops_;
      loops_ = 0;
      Soft strict(*this, false);
      CLEAVE_RETURN_IF_ERROR(parseBody({"endmacro"}, node->body, stop));
      loops_ = loops;
    } else if (name == "break" || name == "continue") {
      if (loops_ == 0) return error(absl::StrCat("'", name, "' outside a loop"));
      node->kind = name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
    } else if (name == "generation") {
      // Hugging Face's marker of assistant text: renders its body.
      CLEAVE_RETURN_IF_ERROR(expectBlockClose());
      CLEAVE_RETURN_IF_ERROR(parseBody({"endgeneration"}, body, stop));
      return expectBlockClose();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": unknown or unsupported tag '", name, "'"));
    }
    CLEAVE_RETURN_IF_ERROR(expectBlockClose());
    body.push_back(std::move(node));
    return absl::OkStatus();
  }

  // `a` or `a, b` (optionally in parentheses).
  absl::StatusOr<std::vector<std::string>> parseTargets() {
    std::vector<std::string> names;
    const bool parens = isOp("(");
    if (parens) ++at_;
    while (true) {
      CLEAVE_ASSIGN_OR_RETURN(std::string n, expectName());
      names.push_back(std::move(n));
      if (!isOp(",")) break;
      ++at_;
    }
    if (parens) CLEAVE_RETURN_IF_ERROR(expectOp(")"));
    return names;
  }

  ExprPtr make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  // Records the depth of `e`'s tree; past kMaxTreeDepth, too_deep_ holds the error (loops
  // that grow a tree check it at once, so no deeper tree is ever built).
  ExprPtr settle(ExprPtr e) {
    int d = 0;
    for (const ExprPtr& c : e->children) d = c ? std::max(d, c->depth) : d;
    for (const auto& [k, c] : e->keywords) d = std::max(d, c->depth);
    e->depth = d + 1;
    if (e->depth > kMaxTreeDepth && too_deep_.ok()) {
      too_deep_ = absl::InvalidArgumentError(absl::StrCat(
          "line ", e->line, ": expression nested too deeply (over ", kMaxTreeDepth, " levels)"));
    }
    return e;
  }
  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::Kind::kBinary, a->line);
    e->name = op;
    e->children.push_back(std::move(a));
    e->children.push_back(std::move(b));
    return settle(std::move(e));
  }

  // `a, b` without parentheses is a tuple (as in `{{ a, b }}` or `set x = a, b`).
  absl::StatusOr<ExprPtr> parseTupleOrExpression() {
    CLEAVE_ASSIGN_OR_RETURN(ExprPtr first, parseExpression());
    if (!isOp(",")) return first;
    auto tuple = make(Expr::Kind::kTuple, first->line);
    tuple->children.push_back(std::move(first));
    while (isOp(",")) {
      ++at_;
      if (peek().kind == TokenKind::kBlockClose || peek().kind == TokenKind::kPrintClose ||
          isOp(")")) {
        break;  // a trailing comma: `(5,)`
      }
      CLEAVE_ASSIGN_OR_RETURN(ExprPtr item, parseExpression());
      tuple->children.push_back(std::move(item));
    }
    return settle(std::move(tuple));
  }

  absl::StatusOr<ExprPtr> parseExpression(bool with_conditional = true) {
    if (++depth_ > kMaxDepth) return error("expression nested too deeply");
    CLEAVE_ASSIGN_OR_RETURN(ExprPtr e, parseOr());
    while (with_conditional && isName("if")) {
      ++at_;
      auto c = make(Expr::Kind::kConditional, e->line);
      c->children.push_back(std::move(e));
      CLEAVE_ASSIGN_OR_RETURN(ExprPtr condition, parseOr());
      c->children.push_back(std::move(condition));
      if (isName("else")) {
        ++at_;
        Soft soft(*this, true);
        CLEAVE_ASSIGN_OR_RETURN(ExprPtr otherwise, parseExpression());
        c->children.push_back(std::move(otherwise));
      } else {
        c->children.push_back(nullptr);
      }
      e = settle(std::move(c));
      CLEAVE_RETURN_IF_ERROR(too_deep_);
    }
    --depth_;
    return e;
  }

  // One level of left-associative binary operators: `next` operands joined by the
  // operators (names or symbols) in `ops`.
  using Level = absl::StatusOr<ExprPtr> (Parser::*)();
  absl::StatusOr<ExprPtr> parseLevel(std::initializer_list<const char*> ops, Level next_level) {
    CLEAVE_ASSIGN_OR_RETURN(ExprPtr e, (this->*next_level)());
    while (true) {
      const char* op = nullptr;
      for (const char* candidate : ops) {
        if (isOp(candidate) || isName(candidate)) op = candidate;
      }
      if (op == nullptr) return e;
      ++at_;
      CLEAVE_ASSIGN_OR_RETURN(ExprPtr r, (this->*next_level)());
      e = binary(op, std::move(e), std::move(r));
      CLEAVE_RETURN_IF_ERROR(too_deep_);
    }
  }

  absl::StatusOr<ExprPtr> parseOr() { return parseLevel({"or"}, &Parser::parseAnd); }
  absl::StatusOr<ExprPtr> parseAnd() { return parseLevel({"and"}, &Parser::parseNot); }

  absl::StatusOr<ExprPtr> parseNot() {
    if (isName("not")) {
      const int line = next().line;
      if (++depth_ > kMaxDepth) return error("expression nested too deeply");
      CLEAVE_ASSIGN_OR_RETURN(ExprPtr operand, parseNot());
      --depth_;
      auto e = make(Expr::Kind::kUnary, line);
      e->name = "not";
      e->children.push_back(std::move(operand));
      return settle(std::move(e));
    }
    return parseCompare();
  }

  // `a < b < c` is Python's chain: a < b and b < c, b evaluated once.
  absl::StatusOr<ExprPtr> parseCompare() {
    CLEAVE_ASSIGN_OR_RETURN(ExprPtr first, parseMath1());
    auto chain = make(Expr::Kind::kCompare, first->line);
    chain->children.push_back(std::move(first));
    while (true) {
      std::string op;
      if (peek().kind == TokenKind::kOperator &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
           peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (isName("in")) {
        ++at_;
        op = "in";
      } else if (isName("not") && isName("in", 1)) {
        at_ += 2;
        op = "not in";
      } else {
        break;
      }
      CLEAVE_ASSIGN_OR_RETURN(ExprPtr r, parseMath1());
      chain->ops.push_back(op);
      chain->children.push_back(std::move(r));
      if (chain->children.size() > static_cast<size_t>(kMaxTreeDepth)) {
        return error("comparison chain too long");
      }
    }
    if (chain->ops.empty()) return std::move(chain->children[0]);
    if (chain->ops.size() == 1)
      return binary(chain->ops[0], std::move(chain->children[0]), std::move(chain->children[1]));
    return settle(std::move(chain));
  }

  // Jinja's precedence, loosest first: + -, then ~, then * / // %, then **.
  absl::StatusOr<ExprPtr> parseMath1() { return parseLevel({"+", "-"}, &Parser::parseConcat); }
  absl::StatusOr<ExprPtr> parseConcat() { return parseLevel({"~"}, &Parser::parseMath2); }
  absl::StatusOr<ExprPtr> parseMath2() {
    return parseLevel({"*", "/", "//", "%"}, &Parser::parsePow);
  }
  absl::StatusOr<ExprPtr> parsePow() { return parseLevel({"**"}, &Parser::parseOperand); }
  absl::StatusOr<ExprPtr> parseOperand() { return parseUnary(true); }

  absl::StatusOr<ExprPtr> parseUnary(bool with_filter) {
    ExprPtr e;
    if (isOp("-") || isOp("+")) {
      const Token& t = next();
      if (++depth_ > kMaxDepth) return error("expression nested too deeply");
      CLEAVE_ASSIGN_OR_RETURN(ExprPtr operand, parseUnary(false));
      --depth_;
      e = make(Expr::Kind::kUnary, t.line);
      e->name = t.text;
      e->children.push_back(std::move(operand));
      e = settle(std::move(e));
    } else {
      CLEAVE_ASSIGN_OR_RETURN(e, parsePrimary());
    }
    CLEAVE_ASSIGN_OR_RETURN(e, parsePostfix(std::move(e)));
    if (with_filter) {
      CLEAVE_ASSIGN_OR_RETURN(e, parseFilters(std::move(e)));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> parsePrimary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::kName: {
        ++at_;
        auto e = make(Expr::Kind::kLiteral, t.line);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::none();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        return e;
      }
      case TokenKind::kString: {
        std::string s;
        while (peek().kind == TokenKind::kString) s += next().text;  // adjacent literals join
        auto e = make(Expr::Kind::kLiteral, t.line);
        e->literal = Value(std::move(s));
        return e;
      }
      case TokenKind::kInteger:
      case TokenKind::kFloat: {
        ++at_;
        auto e = make(Expr::Kind::kLiteral, t.line);
        e->literal = t.kind == TokenKind::kInteger ? Value(t.integer) : Value(t.number);
        return e;
      }
      case TokenKind::kOperator:
        if (t.text == "(") {
          ++at_;
          if (isOp(")")) {
            ++at_;
            return make(Expr::Kind::kTuple, t.line);
          }
          CLEAVE_ASSIGN_OR_RETURN(ExprPtr inner, parseTupleOrExpression());
          CLEAVE_RETURN_IF_ERROR(expectOp(")"));
          return inner;
        }
        if (t.text == "[") {
          ++at_;
          auto e = make(Expr::Kind::kList, t.line);
          while (!isOp("]")) {
            CLEAVE_ASSIGN_OR_RETURN(ExprPtr item, parseExpression());
            e->children.push_back(std::move(item));
            if (!isOp(",")) break;
            ++at_;
          }
          CLEAVE_RETURN_IF_ERROR(expectOp("]"));
          return settle(std::move(e));
        }
        if (t.text == "{") {
          ++at_;
          auto e = make(Expr::Kind::kDict, t.line);
          while (!isOp("}")) {
            CLEAVE_ASSIGN_OR_RETURN(ExprPtr key, parseExpression());
            CLEAVE_RETURN_IF_ERROR(expectOp(":"));
            CLEAVE_ASSIGN_OR_RETURN(ExprPtr value, parseExpression());
            e->children.push_back(std::move(key));
            e->children.push_back(std::move(value));
            if (!isOp(",")) break;
            ++at_;
          }
          CLEAVE_RETURN_IF_ERROR(expectOp("}"));
          return settle(std::move(e));
        }
        break;
      default: break;
    }
    return error(absl::StrCat("expected an expression, found ", describe(t)));
  }

  // Arguments of a call, filter or test: `(a, b, key=c)`, after the '('.
  absl::Status parseArguments(Expr& e) {
    while (!isOp(")")) {
      if (peek().kind == TokenKind::kName && isOp("=", 1)) {
        std::string key = next().text;
        ++at_;
        CLEAVE_ASSIGN_OR_RETURN(ExprPtr value, parseExpression());
        e.keywords.emplace_back(std::move(key), std::move(value));
      } else {
        if (!e.keywords.empty()) return error("a positional argument follows a keyword argument");
        CLEAVE_ASSIGN_OR_RETURN(ExprPtr value, parseExpression());
        e.children.push_back(std::move(value));
      }
      if (!isOp(",")) break;
      ++at_;
    }
    return expectOp(")");
  }

  absl::StatusOr<ExprPtr> parsePostfix(ExprPtr e) {
    while (true) {
      if (isOp(".")) {
        ++at_;
        const Token& t = next();
        if (t.kind != TokenKind::kName && t.kind != TokenKind::kInteger) {
          return error(absl::StrCat("expected an attribute name after '.', found ", describe(t)));
        }
        if (t.kind == TokenKind::kInteger) {
          auto item = make(Expr::Kind::kItem, t.line);
          item->children.push_back(std::move(e));
          auto index = make(Expr::Kind::kLiteral, t.line);
          index->literal = Value(t.integer);
          item->children.push_back(std::move(index));
          e = settle(std::move(item));
          CLEAVE_RETURN_IF_ERROR(too_deep_);
          continue;
        }
        auto a = make(Expr::Kind::kAttribute, t.line);
        a->name = t.text;
        a->children.push_back(std::move(e));
        e = settle(std::move(a));
        CLEAVE_RETURN_IF_ERROR(too_deep_);
      } else if (isOp("[")) {
        const int line = next().line;
        ExprPtr bounds[3];
        bool slice = false;
        for (int part = 0; part < 3; ++part) {
          if (!isOp(":") && !isOp("]")) {
            CLEAVE_ASSIGN_OR_RETURN(bounds[part], parseExpression());
          }
          if (!isOp(":")) break;
          slice = true;
          ++at_;
        }
        CLEAVE_RETURN_IF_ERROR(expectOp("]"));
        if (!slice && bounds[0] == nullptr) return error("empty subscript '[]'");
        auto s = make(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, line);
        s->children.push_back(std::move(e));
        for (int part = 0; part < (slice ? 3 : 1); ++part)
          s->children.push_back(std::move(bounds[part]));
        e = settle(std::move(s));
        CLEAVE_RETURN_IF_ERROR(too_deep_);
      } else if (isOp("(")) {
        const int line = next().line;
        auto c = make(Expr::Kind::kCall, line);
        c->children.push_back(std::move(e));
        CLEAVE_RETURN_IF_ERROR(parseArguments(*c));
        e = settle(std::move(c));
        CLEAVE_RETURN_IF_ERROR(too_deep_);
      } else {
        return e;
      }
    }
  }

  absl::StatusOr<ExprPtr> parseFilters(ExprPtr e) {
    while (true) {
      if (isOp("|")) {
        ++at_;
        const int line = peek().line;
        CLEAVE_ASSIGN_OR_RETURN(std::string name, expectName());
        if (!isFilter(name) && !soft_) {
          return absl::InvalidArgumentError(
              absl::StrCat("line ", line, ": no filter named '", name, "'"));
        }
        auto f = make(Expr::Kind::kFilter, line);
        f->name = std::move(name);
        f->children.push_back(std::move(e));
        if (isOp("(")) {
          ++at_;
          CLEAVE_RETURN_IF_ERROR(parseArguments(*f));
        }
        f = settle(std::move(f));
        CLEAVE_RETURN_IF_ERROR(too_deep_);
        CLEAVE_ASSIGN_OR_RETURN(e, parsePostfix(std::move(f)));
      } else if (isName("is")) {
        ++at_;
        const int line = peek().line;
        auto t = make(Expr::Kind::kTest, line);
        if (isName("not")) {
          ++at_;
          t->negated = true;
        }
        // `none`, `true` and `false` are test names here, not literals.
        CLEAVE_ASSIGN_OR_RETURN(std::string name, expectName());
        if (!isTest(name) && !soft_) {
          return absl::InvalidArgumentError(
              absl::StrCat("line ", line, ": no test named '", name, "'"));
        }
        t->name = std::move(name);
        t->children.push_back(std::move(e));
        if (isOp("(")) {
          ++at_;
          CLEAVE_RETURN_IF_ERROR(parseArguments(*t));
        } else if (peek().kind == TokenKind::kString || peek().kind == TokenKind::kInteger ||
                   peek().kind == TokenKind::kFloat || isOp("[") || isOp("{") ||
                   (peek().kind == TokenKind::kName && !isName("and") && !isName("or") &&
                    !isName("else") && !isName("if") && !isName("in") && !isName("is") &&
                    !isName("not"))) {
          // `x is divisibleby 3`, `x is sameas none`: one argument without parentheses.
          CLEAVE_ASSIGN_OR_RETURN(ExprPtr argument, parsePrimary());
          CLEAVE_ASSIGN_OR_RETURN(argument, parsePostfix(std::move(argument)));
          t->children.push_back(std::move(argument));
        }
        e = settle(std::move(t));
        CLEAVE_RETURN_IF_ERROR(too_deep_);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t at_ = 0;
  int depth_ = 0;
  int loops_ = 0;
  absl::Status too_deep_;
  // Whether an unknown filter or test is an error when evaluated rather than now (inside an
  // if's branches and a conditional's else, not inside a loop or macro there).
  bool soft_ = false;
  struct Soft {
    Soft(Parser& p, bool soft) : parser(p), saved(p.soft_) { p.soft_ = soft; }
    ~Soft() { parser.soft_ = saved; }
    Parser& parser;
    bool saved;
  };
};

}  // namespace

absl::StatusOr<Body> parse(const std::string& source) {
  CLEAVE_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source));
  return Parser(std::move(tokens)).run();
}

}  // namespace cleave::jinja
