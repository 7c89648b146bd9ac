#include "services/engine/grammar.h"

#include <algorithm>
#include <functional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/engine/regex_nfa.h"

namespace cleave::engine {

// Parses GBNF into a tree per rule (calls by rule index), then emits every rule into one
// NFA and checks it for left recursion.
class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::string_view text) : p_(text) {}

  absl::StatusOr<std::shared_ptr<const Grammar>> compile() {
    if (p_.size() > Grammar::kMaxBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("the grammar is larger than ", Grammar::kMaxBytes / 1024, " KiB"));
    }
    std::vector<std::pair<std::string, size_t>> defined;  // name, where
    std::vector<NfaNode> bodies;
    for (blanks(); !done(); blanks()) {
      const size_t at = pos_;
      const std::string name = ruleName();
      if (name.empty()) return fail("expects a rule name");
      blanks();
      if (p_.substr(pos_, 3) != "::=") return fail("expects ::= after the rule name");
      pos_ += 3;
      NfaNode body = alternation(0);
      if (!error_.ok()) return error_;
      if (!names_.contains(name) && names_.size() >= Grammar::kMaxRules) {
        pos_ = at;
        return fail(absl::StrCat("has more than ", Grammar::kMaxRules, " rules"));
      }
      const int32_t index = ruleIndex(name, at);
      if (static_cast<size_t>(index) < bodies.size() && defined[index].second != SIZE_MAX) {
        pos_ = at;
        return fail(absl::StrCat("defines rule '", name, "' twice"));
      }
      if (bodies.size() <= static_cast<size_t>(index)) {
        bodies.resize(index + 1);
        defined.resize(index + 1, {"", SIZE_MAX});
      }
      bodies[index] = std::move(body);
      defined[index] = {name, at};
    }
    const auto root = names_.find("root");
    if (root == names_.end() || static_cast<size_t>(root->second) >= defined.size() ||
        defined[root->second].second == SIZE_MAX) {
      return absl::InvalidArgumentError("the grammar has no rule named 'root'");
    }
    for (const auto& [name, index] : names_) {
      if (static_cast<size_t>(index) >= defined.size() || defined[index].second == SIZE_MAX) {
        pos_ = used_at_[index];
        return fail(absl::StrCat("uses rule '", name, "', which it does not define"));
      }
    }
    // One NFA: each rule ends in the shared match state, its calls patched to the callees'
    // starts once all are emitted.
    auto grammar = std::make_shared<Grammar>();
    grammar->text_ = std::string(p_);
    grammar->nfa_ = std::make_shared<Regex>();
    Regex& nfa = *grammar->nfa_;
    nfa.pattern_ = grammar->text_;
    NfaEmitter emitter(&nfa.states_);
    const int32_t match = emitter.add({.kind = Regex::State::Kind::kMatch});
    std::vector<int32_t> starts(bodies.size());
    for (size_t r = 0; r < bodies.size(); ++r) starts[r] = emitter.emit(bodies[r], match);
    if (emitter.full()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the grammar needs more than ", Regex::kMaxStates, " automaton states; simplify it"));
    }
    for (Regex::State& s : nfa.states_) {
      if (s.kind == Regex::State::Kind::kCall) s.alt = starts[s.alt];
    }
    nfa.start_ = starts[root->second];
    nfa.classify();
    if (absl::Status checked = checkRules(nfa, starts, defined); !checked.ok()) return checked;
    return grammar;
  }

 private:
  absl::Status fail(const std::string& what) {
    if (error_.ok()) {
      size_t line = 1, column = 1;
      for (size_t i = 0; i < std::min(pos_, p_.size()); ++i) {
        column = p_[i] == '\n' ? 1 : column + 1;
        line += p_[i] == '\n';
      }
      error_ = absl::InvalidArgumentError(
          absl::StrCat("the grammar ", what, " (at line ", line, ", column ", column, ")"));
    }
    return error_;
  }
  bool done() const { return pos_ >= p_.size() || !error_.ok(); }
  char peek() const { return p_[pos_]; }
  // Spaces, newlines and comments.
  void blanks() {
    while (pos_ < p_.size()) {
      if (p_[pos_] == '#') {
        while (pos_ < p_.size() && p_[pos_] != '\n') ++pos_;
      } else if (absl::ascii_isspace(static_cast<unsigned char>(p_[pos_]))) {
        ++pos_;
      } else {
        break;
      }
    }
  }
  static bool nameChar(char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  }
  std::string ruleName() {
    const size_t from = pos_;
    while (pos_ < p_.size() && nameChar(p_[pos_])) ++pos_;
    return std::string(p_.substr(from, pos_ - from));
  }
  // The index of rule `name`, first named at `at`.
  int32_t ruleIndex(const std::string& name, size_t at) {
    auto [it, added] = names_.emplace(name, static_cast<int32_t>(names_.size()));
    if (added) used_at_.push_back(at);
    return it->second;
  }
  // Whether a new rule starts at pos_ (a name, then ::=).
  bool ruleStarts() const {
    size_t i = pos_;
    while (i < p_.size() && nameChar(p_[i])) ++i;
    if (i == pos_) return false;
    while (i < p_.size() && (p_[i] == ' ' || p_[i] == '\t')) ++i;
    return p_.substr(i, 3) == "::=";
  }

  NfaNode alternation(int depth) {
    if (depth > kMaxDepth) {
      fail(absl::StrCat("nests groups more than ", kMaxDepth, " deep"));
      return {};
    }
    NfaNode alt{.kind = NfaNode::Kind::kAlt};
    alt.children.push_back(sequence(depth));
    while (!done() && peek() == '|') {
      ++pos_;
      alt.children.push_back(sequence(depth));
    }
    return alt.children.size() == 1 ? std::move(alt.children[0]) : alt;
  }

  NfaNode sequence(int depth) {
    NfaNode cat{.kind = NfaNode::Kind::kConcat};
    for (blanks(); !done() && peek() != '|' && peek() != ')' && !ruleStarts(); blanks()) {
      NfaNode item = primary(depth);
      blanks();
      cat.children.push_back(postfix(std::move(item)));
    }
    return cat;
  }

  // One repetition after an item (a second, as "a"*+, is refused: group the first).
  NfaNode postfix(NfaNode item) {
    if (done()) return item;
    int min = 0, max = -1;
    if (peek() == '*') {
      ++pos_;
    } else if (peek() == '+') {
      ++pos_;
      min = 1;
    } else if (peek() == '?') {
      ++pos_;
      max = 1;
    } else if (peek() == '{') {
      if (!counted(min, max)) return item;
    } else {
      return item;
    }
    blanks();
    if (!done() && std::string_view("*+?{").find(peek()) != std::string_view::npos) {
      fail("repeats a repeat; put the first in a group");
      return item;
    }
    return NfaNode{
        .kind = NfaNode::Kind::kRepeat, .children = {std::move(item)}, .min = min, .max = max};
  }

  bool counted(int& min, int& max) {
    ++pos_;
    auto number = [&](int& value) {
      const size_t from = pos_;
      for (value = 0; pos_ < p_.size() && absl::ascii_isdigit(static_cast<unsigned char>(p_[pos_]));
           ++pos_) {
        value = std::min(value * 10 + (p_[pos_] - '0'), Regex::kMaxRepeat + 1);
      }
      return pos_ > from;
    };
    blanks();
    if (!number(min)) {
      fail("expects a count after {");
      return false;
    }
    blanks();
    max = min;
    if (!done() && peek() == ',') {
      ++pos_;
      blanks();
      if (!number(max)) max = -1;
      blanks();
    }
    if (done() || peek() != '}') {
      fail("expects } to end a count");
      return false;
    }
    ++pos_;
    if (min > Regex::kMaxRepeat || max > Regex::kMaxRepeat) {
      fail(absl::StrCat("repeats more than ", Regex::kMaxRepeat, " times"));
      return false;
    }
    if (max >= 0 && max < min) {
      fail("has a count {m,n} with n < m");
      return false;
    }
    return true;
  }

  NfaNode primary(int depth) {
    const char c = peek();
    if (c == '"') return literal();
    if (c == '[') return charClass();
    if (c == '.') {
      ++pos_;
      return NfaNode{.kind = NfaNode::Kind::kSet, .set = {{0, kMaxCodepoint}}};
    }
    if (c == '(') {
      ++pos_;
      NfaNode inner = alternation(depth + 1);
      blanks();
      if (done() || peek() != ')') {
        fail("has an unterminated group '('");
        return {};
      }
      ++pos_;
      return inner;
    }
    if (nameChar(c)) {
      const size_t at = pos_;
      const std::string name = ruleName();
      if (names_.size() >= Grammar::kMaxRules && !names_.contains(name)) {
        fail(absl::StrCat("has more than ", Grammar::kMaxRules, " rules"));
        return {};
      }
      return NfaNode{.kind = NfaNode::Kind::kCall, .rule = ruleIndex(name, at)};
    }
    fail(absl::StrCat("has '", std::string(1, c), "' where an item should be"));
    return {};
  }

  // One character at pos_ (a literal's or a class's), escapes read.
  uint32_t character() {
    if (peek() != '\\') return codepoint();
    ++pos_;
    if (done()) {
      fail("ends in a lone backslash");
      return 0;
    }
    const char e = p_[pos_++];
    switch (e) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'x':
      case 'u':
      case 'U': {
        const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int i = 0; i < digits; ++i, ++pos_) {
          const char h = pos_ < p_.size() ? p_[pos_] : ' ';
          if (!absl::ascii_isxdigit(static_cast<unsigned char>(h))) {
            fail(absl::StrCat("has \\", std::string(1, e), " without ", digits, " hex digits"));
            return 0;
          }
          cp = cp * 16 + static_cast<uint32_t>(absl::ascii_isdigit(static_cast<unsigned char>(h))
                                                   ? h - '0'
                                                   : absl::ascii_tolower(h) - 'a' + 10);
        }
        if (cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
          fail("escapes a value that is no character");
          return 0;
        }
        return cp;
      }
      default: return static_cast<unsigned char>(e);  // \\ \" \] \[ \- and the like.
    }
  }

  // The UTF-8 character at pos_.
  uint32_t codepoint() {
    uint32_t cp = 0;
    if (!decodeUtf8(p_, pos_, cp)) fail("is not valid UTF-8");
    return cp;
  }

  NfaNode literal() {
    ++pos_;
    NfaNode cat{.kind = NfaNode::Kind::kConcat};
    while (!done() && peek() != '"') {
      if (peek() == '\n') break;
      const uint32_t c = character();
      cat.children.push_back(NfaNode{.kind = NfaNode::Kind::kSet, .set = {{c, c}}});
    }
    if (done() || peek() != '"') {
      fail("has an unterminated string");
      return {};
    }
    ++pos_;
    return cat;
  }

  NfaNode charClass() {
    ++pos_;
    const bool negated = !done() && peek() == '^';
    if (negated) ++pos_;
    CharSet set;
    while (!done() && peek() != ']') {
      const uint32_t lo = character();
      uint32_t hi = lo;
      if (pos_ + 1 < p_.size() && peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        hi = character();
        if (hi < lo) fail("has a class range out of order");
      }
      set.push_back({lo, hi});
    }
    if (done() || peek() != ']') {
      fail("has an unterminated class '['");
      return {};
    }
    ++pos_;
    normalize(set);
    return NfaNode{.kind = NfaNode::Kind::kSet, .set = negated ? complement(set) : set};
  }

  // A rule that can call itself before reading a byte never ends expanding, and one that
  // cannot end leads outputs into dead ends: both refused.
  absl::Status checkRules(const Regex& nfa, const std::vector<int32_t>& starts,
                          const std::vector<std::pair<std::string, size_t>>& defined) {
    const std::vector<Regex::State>& states = nfa.states();
    std::vector<int32_t> rule_of_start(states.size(), -1);
    for (size_t r = 0; r < starts.size(); ++r) rule_of_start[starts[r]] = static_cast<int32_t>(r);
    // Which rules can end without reading (fixpoint), then which each calls first.
    // Walks a rule from `from` to its end, past calls of rules `passable` marks, and past
    // bytes when `reading`; true when it ends. Marks are stamped per walk (no clearing).
    std::vector<uint32_t> stamp(states.size(), 0);
    uint32_t walks = 0;
    auto walk = [&](int32_t from, const std::vector<bool>& passable, bool reading,
                    const std::function<void(int32_t callee)>& called) {
      std::vector<int32_t> stack{from};
      ++walks;
      bool ends = false;
      while (!stack.empty()) {
        const int32_t s = stack.back();
        stack.pop_back();
        if (stamp[s] == walks) continue;
        stamp[s] = walks;
        const Regex::State& state = states[s];
        if (state.kind == Regex::State::Kind::kFork) {
          stack.push_back(state.next);
          stack.push_back(state.alt);
        } else if (state.kind == Regex::State::Kind::kCall) {
          const int32_t callee = rule_of_start[state.alt];
          called(callee);
          if (callee >= 0 && passable[callee]) stack.push_back(state.next);
        } else if (state.kind == Regex::State::Kind::kMatch) {
          ends = true;
        } else if (reading && state.lo <= state.hi) {
          stack.push_back(state.next);
        }
      }
      return ends;
    };
    // Which rules can end without reading, and which can end at all (fixpoints).
    auto ending = [&](bool reading) {
      std::vector<bool> ends(starts.size(), false);
      for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = 0; r < starts.size(); ++r) {
          if (!ends[r] && walk(starts[r], ends, reading, [](int32_t) {})) {
            ends[r] = true;
            changed = true;
          }
        }
      }
      return ends;
    };
    const std::vector<bool> nullable = ending(false);
    std::vector<std::vector<int32_t>> first_calls(starts.size());
    for (size_t r = 0; r < starts.size(); ++r) {
      walk(starts[r], nullable, false, [&](int32_t callee) {
        if (callee >= 0) first_calls[r].push_back(callee);
      });
    }
    // A cycle among first calls (depth-first, colouring the rules on the path).
    std::vector<int> colour(starts.size(), 0);
    std::vector<int32_t> path;
    std::function<int32_t(int32_t)> cycle = [&](int32_t r) -> int32_t {
      colour[r] = 1;
      path.push_back(r);
      for (int32_t callee : first_calls[r]) {
        if (colour[callee] == 1) return callee;
        if (colour[callee] == 0) {
          if (const int32_t found = cycle(callee); found >= 0) return found;
        }
      }
      colour[r] = 2;
      path.pop_back();
      return -1;
    };
    for (size_t r = 0; r < starts.size(); ++r) {
      if (colour[r] != 0) continue;
      if (const int32_t back = cycle(static_cast<int32_t>(r)); back >= 0) {
        std::vector<std::string> names;
        auto from = std::find(path.begin(), path.end(), back);
        for (auto it = from; it != path.end(); ++it) names.push_back(defined[*it].first);
        names.push_back(defined[back].first);
        pos_ = defined[back].second;
        return fail(absl::StrCat("has left recursion (", absl::StrJoin(names, " -> "),
                                 " before reading anything); write it with repetition, as "
                                 "x ::= y (op y)*"));
      }
    }
    const std::vector<bool> finite = ending(true);
    for (size_t r = 0; r < starts.size(); ++r) {
      if (finite[r]) continue;
      pos_ = defined[r].second;
      return fail(absl::StrCat("has rule '", defined[r].first,
                               "', which can never end (every way through it calls a rule that "
                               "never ends, or itself)"));
    }
    return absl::OkStatus();
  }

  static constexpr int kMaxDepth = 64;
  std::string_view p_;
  size_t pos_ = 0;
  absl::Status error_;
  std::map<std::string, int32_t> names_;
  std::vector<size_t> used_at_;  // Where each rule's name first appears.
};

absl::StatusOr<std::shared_ptr<const Grammar>> Grammar::compile(std::string_view text) {
  return GrammarCompiler(text).compile();
}

bool Grammar::fullMatch(std::string_view text) const {
  // A GrammarDfa needs a shared Grammar; this one lives as long as the call.
  GrammarDfa dfa(std::shared_ptr<const Grammar>(this, [](const Grammar*) {}), 1);
  GrammarDfa::Set set = dfa.set(dfa.start());
  for (char c : text) {
    set = dfa.stepSet(set, static_cast<uint8_t>(c));
    if (set.empty()) return false;
  }
  return std::any_of(set.begin(), set.end(), [&](const GrammarDfa::Config& c) {
    return states()[c.state].kind == Regex::State::Kind::kMatch;
  });
}

GrammarDfa::GrammarDfa(std::shared_ptr<const Grammar> grammar, size_t max_states)
    : grammar_(std::move(grammar)), max_states_(std::max<size_t>(max_states, 2)) {
  stacks_.push_back({-1, -1, 0});  // The empty stack.
  start_ = reset(close({{grammar_->start(), 0}}));
}

int32_t GrammarDfa::push(int32_t state, int32_t below) {
  const int32_t depth = stacks_[below].depth + 1;
  if (depth > kMaxDepth) return -1;
  if (stacks_.size() >= kMaxStacks) {  // Only stacks made before.
    const auto it = stack_ids_.find({state, below});
    return it == stack_ids_.end() ? -1 : it->second;
  }
  auto [it, added] = stack_ids_.emplace(std::pair{state, below}, stacks_.size());
  if (added) stacks_.push_back({state, below, depth});
  return it->second;
}

GrammarDfa::Set GrammarDfa::close(Set set) {
  const std::vector<Regex::State>& states = grammar_->states();
  std::vector<Config> work(set.rbegin(), set.rend());
  std::set<Config> seen;
  Set out;
  while (!work.empty() && seen.size() < 8 * kMaxConfigs) {
    const Config c = work.back();
    work.pop_back();
    if (!seen.insert(c).second) continue;
    const Regex::State& s = states[c.state];
    switch (s.kind) {
      case Regex::State::Kind::kFork:
        work.push_back({s.alt, c.stack});
        work.push_back({s.next, c.stack});
        break;
      case Regex::State::Kind::kCall:
        if (states[s.next].kind == Regex::State::Kind::kMatch) {
          work.push_back({s.alt, c.stack});  // A last call returns where its caller does.
        } else if (const int32_t pushed = push(s.next, c.stack); pushed >= 0) {
          work.push_back({s.alt, pushed});
        }
        break;
      case Regex::State::Kind::kMatch:
        if (c.stack == 0) {
          out.push_back(c);  // The root's end: the output may stop here.
        } else {
          const Frame& top = stacks_[c.stack];
          work.push_back({top.state, top.below});
        }
        break;
      case Regex::State::Kind::kByte:
        if (s.lo <= s.hi) out.push_back(c);  // An empty class leads nowhere.
        break;
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.size() > kMaxConfigs) out.resize(kMaxConfigs);
  return out;
}

GrammarDfa::Set GrammarDfa::stepSet(const Set& set, uint8_t byte) {
  const std::vector<Regex::State>& states = grammar_->states();
  Set next;
  for (const Config& c : set) {
    const Regex::State& s = states[c.state];
    if (s.kind == Regex::State::Kind::kByte && byte >= s.lo && byte <= s.hi)
      next.push_back({s.next, c.stack});
  }
  return next.empty() ? next : close(std::move(next));
}

int32_t GrammarDfa::reset(Set set) {
  sets_.clear();
  ids_.clear();
  next_.clear();
  accepting_.clear();
  stored_ = 0;
  intern({});
  start_ = intern(std::move(set));
  return start_;
}

int32_t GrammarDfa::intern(Set set) {
  if (auto it = ids_.find(set); it != ids_.end()) return it->second;
  // Past the states or the configurations they hold in all (the dead and a start fit).
  if (sets_.size() >= 2 && (sets_.size() >= max_states_ || stored_ + set.size() > kMaxStored))
    return kFull;
  stored_ += set.size();
  const auto id = static_cast<int32_t>(sets_.size());
  const std::vector<Regex::State>& states = grammar_->states();
  accepting_.push_back(std::any_of(set.begin(), set.end(), [&](const Config& c) {
    return states[c.state].kind == Regex::State::Kind::kMatch;
  }));
  ids_.emplace(set, id);
  sets_.push_back(std::move(set));
  next_.resize(sets_.size() * 256, -1);
  return id;
}

int32_t GrammarDfa::step(int32_t state, uint8_t byte) {
  const size_t at = static_cast<size_t>(state) * 256 + byte;
  if (next_[at] >= 0) return next_[at];
  const int32_t id = intern(stepSet(sets_[state], byte));
  if (id == kFull) return id;
  // Every byte of the class goes the same way (intern() may have grown next_: index anew).
  grammar_->nfa().fillClass(byte, &next_[static_cast<size_t>(state) * 256], id);
  return id;
}

absl::StatusOr<std::shared_ptr<const Grammar>> outputGrammar(std::string_view text) {
  if (text.empty()) return nullptr;
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar = Grammar::compile(text);
  if (!grammar.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.grammar: ", grammar.status().message()));
  }
  return grammar;
}

}  // namespace cleave::engine
