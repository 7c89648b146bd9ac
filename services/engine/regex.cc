#include "services/engine/regex.h"
#include "services/engine/regex_nfa.h"

#include <algorithm>
#include <array>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"

namespace cleave::engine {
namespace {

CharSet asciiClass(char name) {
  CharSet set;
  switch (name) {
    case 'd': set = {{'0', '9'}}; break;
    case 'w': set = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; break;
    case 's': set = {{'\t', '\r'}, {' ', ' '}}; break;
  }
  return set;
}

}  // namespace

// Parses a pattern into an NfaNode tree, then builds the NFA back to front (each node's states
// are made knowing where they lead).
class RegexCompiler {
 public:
  explicit RegexCompiler(std::string_view pattern) : p_(pattern) {}

  absl::StatusOr<std::shared_ptr<const Regex>> compile() {
    auto regex = std::make_shared<Regex>();
    regex->pattern_ = std::string(p_);
    if (!p_.empty() && p_[0] == '^') pos_ = 1;
    NfaNode root = alternation();
    if (error_.ok() && pos_ < p_.size()) fail("unbalanced ')'");
    if (!error_.ok()) return error_;
    NfaEmitter emitter(&regex->states_);
    const int32_t match = emitter.add({.kind = Regex::State::Kind::kMatch});
    regex->start_ = emitter.emit(root, match);
    if (emitter.full()) {
      fail(absl::StrCat("needs more than ", Regex::kMaxStates,
                        " automaton states (smaller counted repeats)"));
    }
    if (!error_.ok()) return error_;
    regex->classify();
    return regex;
  }

 private:
  void fail(const std::string& what) {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(
          absl::StrCat("the regular expression ", what, " (at byte ", pos_, ")"));
    }
  }
  bool done() const { return pos_ >= p_.size() || !error_.ok(); }
  char peek() const { return p_[pos_]; }
  bool take(char c) {
    if (pos_ < p_.size() && p_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  NfaNode alternation() {
    NfaNode alt{.kind = NfaNode::Kind::kAlt};
    alt.children.push_back(concatenation());
    while (!done() && take('|')) alt.children.push_back(concatenation());
    return alt.children.size() == 1 ? std::move(alt.children[0]) : alt;
  }

  NfaNode concatenation() {
    NfaNode cat{.kind = NfaNode::Kind::kConcat};
    while (!done() && peek() != '|' && peek() != ')') {
      if (peek() == '$' && pos_ + 1 == p_.size()) {
        ++pos_;  // The match is whole anyway.
        break;
      }
      cat.children.push_back(repetition());
    }
    return cat;
  }

  NfaNode repetition() {
    NfaNode atom = this->atom();
    bool repeated = false;
    while (!done()) {
      int min = 0, max = -1;
      const size_t at = pos_;
      if (take('*')) {
      } else if (take('+')) {
        min = 1;
      } else if (take('?')) {
        max = 1;
      } else if (!counted(min, max)) {
        break;
      }
      if (repeated) {
        pos_ = at;
        fail("repeats a repeat (put the inner one in a group)");
        break;
      }
      repeated = true;
      take('?');  // Lazy: the same language.
      if (!done() && peek() == '+') fail("uses a possessive quantifier, which is not supported");
      atom = NfaNode{
          .kind = NfaNode::Kind::kRepeat, .children = {std::move(atom)}, .min = min, .max = max};
    }
    return atom;
  }

  // {m}, {m,}, {m,n}; anything else leaves '{' a literal.
  bool counted(int& min, int& max) {
    if (done() || peek() != '{') return false;
    size_t i = pos_ + 1;
    auto number = [&](int& value) {
      const size_t from = i;
      value = 0;
      for (; i < p_.size() && p_[i] >= '0' && p_[i] <= '9'; ++i)  // Saturating past the limit.
        value = std::min(value * 10 + (p_[i] - '0'), Regex::kMaxRepeat + 1);
      return i > from;
    };
    // {m}, {m,}, {m,n}, and as Python reads them, {,n} and {,} (from 0).
    if (!number(min)) {
      if (i >= p_.size() || p_[i] != ',') return false;
      min = 0;
    }
    max = min;
    if (i < p_.size() && p_[i] == ',') {
      ++i;
      if (!number(max)) max = -1;
    }
    if (i >= p_.size() || p_[i] != '}') return false;
    pos_ = i + 1;
    if (min > Regex::kMaxRepeat || max > Regex::kMaxRepeat) {
      fail(absl::StrCat("repeats more than ", Regex::kMaxRepeat, " times"));
    } else if (max >= 0 && max < min) {
      fail("has a repeat {m,n} with n < m");
    }
    return true;
  }

  NfaNode single(CharSet set) {
    return NfaNode{.kind = NfaNode::Kind::kSet, .set = std::move(set)};
  }

  NfaNode atom() {
    const char c = peek();
    if (c == '(') return group();
    if (c == '[') return charClass();
    if (c == '*' || c == '+' || c == '?') {
      fail("has nothing to repeat");
      return {};
    }
    if (c == '^' || c == '$') {
      fail(absl::StrCat("has '", std::string(1, c),
                        "' inside; only ^ at the start and $ at the end are supported"));
      return {};
    }
    if (c == '.') {
      ++pos_;
      return single(complement({{'\n', '\n'}}));
    }
    if (c == '\\') {
      CharSet set;
      escape(set, false);
      return single(std::move(set));
    }
    const uint32_t cp = codepoint();
    return single({{cp, cp}});
  }

  NfaNode group() {
    const size_t open = pos_++;
    if (++depth_ > kMaxDepth) {
      fail(absl::StrCat("nests groups more than ", kMaxDepth, " deep"));
      return {};
    }
    if (take('?')) {
      if (take(':')) {
      } else if (take('P') || (!done() && peek() == '<' && pos_ + 1 < p_.size() &&
                               p_[pos_ + 1] != '=' && p_[pos_ + 1] != '!')) {
        if (!take('<')) {
          fail("uses (?P...) other than a named group (?P<name>...)");
          return {};
        }
        while (!done() && peek() != '>') ++pos_;
        if (!take('>')) fail("has an unterminated group name");
      } else {
        fail("uses (?...): lookaround, flags and conditionals are not supported");
        return {};
      }
    }
    NfaNode inner = alternation();
    --depth_;
    if (!take(')')) {
      pos_ = open;
      fail("has an unterminated group '('");
    }
    return inner;
  }

  NfaNode charClass() {
    ++pos_;
    const bool negated = take('^');
    CharSet set;
    bool first = true;
    while (!done() && (peek() != ']' || first)) {
      first = false;
      uint32_t lo;
      if (peek() == '\\') {
        CharSet item;
        if (!escape(item, true)) {  // A class escape (\d, ...): not a range's end.
          set.insert(set.end(), item.begin(), item.end());
          continue;
        }
        lo = item[0].first;
      } else {
        lo = codepoint();
      }
      uint32_t hi = lo;
      if (pos_ + 1 < p_.size() && peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        if (peek() == '\\') {
          CharSet item;
          if (!escape(item, true)) {
            fail("has a range ending in a class escape");
            break;
          }
          hi = item[0].first;
        } else {
          hi = codepoint();
        }
        if (hi < lo) fail("has a class range out of order");
      }
      set.push_back({lo, hi});
    }
    if (!take(']')) fail("has an unterminated class '['");
    normalize(set);
    return single(negated ? complement(set) : set);
  }

  // An escape at pos_ into `set`; true when it stands for one character.
  bool escape(CharSet& set, bool in_class) {
    ++pos_;
    if (done()) {
      fail("ends in a lone backslash");
      set = {{0, 0}};
      return true;
    }
    const char c = p_[pos_++];
    auto one = [&](uint32_t cp) {
      set = {{cp, cp}};
      return true;
    };
    switch (c) {
      case 'n': return one('\n');
      case 't': return one('\t');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'a': return one('\a');
      case '0': return one(0);
      case 'd':
      case 'w':
      case 's': set = asciiClass(c); return false;
      case 'D':
      case 'W':
      case 'S': set = complement(asciiClass(static_cast<char>(c - 'A' + 'a'))); return false;
      case 'x':
      case 'u': {
        const int digits = c == 'x' ? 2 : 4;
        uint32_t cp = 0;
        for (int i = 0; i < digits; ++i, ++pos_) {
          const char h = pos_ < p_.size() ? p_[pos_] : ' ';
          const int v = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
          if (v < 0) {
            fail(absl::StrCat("has \\", std::string(1, c), " without ", digits, " hex digits"));
            return one(0);
          }
          cp = cp * 16 + static_cast<uint32_t>(v);
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) fail("escapes a surrogate, which is not a character");
        return one(cp);
      }
      case 'b':
        if (in_class) return one('\b');
        break;
      default:
        if (!(c >= '0' && c <= '9') && !(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') &&
            static_cast<unsigned char>(c) < 0x80)
          return one(static_cast<unsigned char>(c));  // Escaped punctuation.
    }
    --pos_;
    fail(c >= '1' && c <= '9'
             ? "uses a backreference, which is not supported"
             : absl::StrCat("uses \\", std::string(1, c), ", which is not supported"));
    return one(0);
  }

  // The UTF-8 character at pos_.
  uint32_t codepoint() {
    uint32_t cp = 0;
    if (!decodeUtf8(p_, pos_, cp)) fail("is not valid UTF-8");
    return cp;
  }

  static constexpr int kMaxDepth = 64;  // The parser and emit() recurse per group.
  std::string_view p_;
  size_t pos_ = 0;
  int depth_ = 0;
  absl::Status error_;
};

absl::StatusOr<std::shared_ptr<const Regex>> Regex::compile(std::string_view pattern) {
  return RegexCompiler(pattern).compile();
}

void Regex::classify() { classifyBytes(states_, byte_class_, class_first_); }

std::string Regex::escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\.^$*+?()[]{}|-").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

RegexDfa::RegexDfa(std::shared_ptr<const Regex> regex, size_t max_states)
    : regex_(std::move(regex)), max_states_(std::max<size_t>(max_states, 2)) {
  std::vector<int32_t> start{regex_->start()};
  regex_->close(start);
  start_ = reset(std::move(start));
}

int32_t RegexDfa::reset(std::vector<int32_t> set) {
  sets_.clear();
  ids_.clear();
  stored_ = 0;
  next_.clear();
  accepting_.clear();
  intern({});
  start_ = intern(std::move(set));
  return start_;
}

int32_t RegexDfa::intern(std::vector<int32_t> set) {
  if (auto it = ids_.find(set); it != ids_.end()) return it->second;
  // Past the states or the NFA states they hold in all (the dead and a start always fit).
  if (sets_.size() >= max_states_ || (sets_.size() >= 2 && stored_ + set.size() > kMaxStored))
    return kFull;
  stored_ += set.size();
  const auto id = static_cast<int32_t>(sets_.size());
  const auto& states = regex_->states();
  accepting_.push_back(std::any_of(set.begin(), set.end(), [&](int32_t s) {
    return states[s].kind == Regex::State::Kind::kMatch;
  }));
  ids_.emplace(set, id);
  sets_.push_back(std::move(set));
  next_.resize(sets_.size() * 256, -1);
  return id;
}

std::vector<int32_t> RegexDfa::stepSet(const std::vector<int32_t>& set, uint8_t byte) const {
  std::vector<int32_t> next;
  for (int32_t s : set) {
    const Regex::State& state = regex_->states()[s];
    if (state.kind == Regex::State::Kind::kByte && byte >= state.lo && byte <= state.hi)
      next.push_back(state.next);
  }
  regex_->close(next);
  return next;
}

int32_t RegexDfa::step(int32_t state, uint8_t byte) {
  const size_t at = static_cast<size_t>(state) * 256 + byte;
  if (next_[at] >= 0) return next_[at];
  // The set's states, and the closure's marks over the whole NFA.
  work_ += sets_[state].size() + 1 + regex_->states().size() / 64;
  const int32_t id = intern(stepSet(sets_[state], byte));
  if (id == kFull) return id;
  // Every byte of the class goes the same way (intern() may have grown next_: index anew).
  regex_->fillClass(byte, &next_[static_cast<size_t>(state) * 256], id);
  return id;
}

bool RegexDfa::expandAll(uint64_t max_work) {
  for (size_t state = 0; state < sets_.size(); ++state) {
    for (int c = 0; c < regex_->classes(); ++c) {
      const uint8_t byte = regex_->classFirst(static_cast<uint8_t>(c));
      if (step(static_cast<int32_t>(state), byte) == kFull || work_ > max_work) return false;
    }
  }
  // Distances back from the accepting states: a lead byte costs a character, a
  // continuation byte nothing (a 0-1 breadth-first search on the reversed edges).
  const size_t n = sets_.size();
  std::vector<std::vector<std::pair<int32_t, uint8_t>>> into(n);
  for (size_t s = 0; s < n; ++s) {
    for (int b = 0; b < 256; ++b) {
      into[next_[s * 256 + b]].push_back({static_cast<int32_t>(s), static_cast<uint8_t>(b)});
    }
  }
  to_accept_.assign(n, kNever);
  std::deque<int32_t> queue;
  for (size_t s = 0; s < n; ++s) {
    if (accepting_[s]) {
      to_accept_[s] = 0;
      queue.push_back(static_cast<int32_t>(s));
    }
  }
  while (!queue.empty()) {
    const int32_t t = queue.front();
    queue.pop_front();
    for (const auto& [s, b] : into[t]) {
      const uint32_t cost = (b & 0xC0) == 0x80 ? 0 : 1;
      if (to_accept_[t] + cost < to_accept_[s]) {
        to_accept_[s] = to_accept_[t] + cost;
        cost == 0 ? queue.push_front(s) : queue.push_back(s);
      }
    }
  }
  // The most characters on to an accepting state, through states that can reach one:
  // unbounded where such a path meets a cycle (a depth-first walk; an edge back to a state
  // on the walk is one).
  to_longest_.assign(n, kNever);
  std::vector<uint8_t> walked(n, 0);          // 1: on the walk, 2: done
  std::vector<std::pair<int32_t, int>> walk;  // state, next byte class to look at
  // `from`'s longest, given the edge on `byte` to `to`, whose longest is known.
  auto relax = [&](int32_t from, int32_t to, uint8_t byte) {
    const uint32_t cost = (byte & 0xC0) == 0x80 ? 0 : 1;
    uint32_t& best = to_longest_[from];
    const uint32_t via = to_longest_[to];
    if (via == kUnbounded || best == kUnbounded) {
      best = kUnbounded;
    } else if (via != kNever && (best == kNever || via + cost > best)) {
      best = via + cost;
    }
  };
  for (size_t root = 0; root < n; ++root) {
    if (walked[root] != 0 || to_accept_[root] == kNever) continue;
    walk.push_back({static_cast<int32_t>(root), 0});
    walked[root] = 1;
    to_longest_[root] = accepting_[root] ? 0 : kNever;
    while (!walk.empty()) {
      auto& [s, c] = walk.back();
      if (c == regex_->classes()) {
        walked[s] = 2;
        const int32_t done = s;
        walk.pop_back();
        if (walk.empty()) break;
        // The parent takes the child's longest through the edge it came by.
        const int32_t parent = walk.back().first;
        const uint8_t byte = regex_->classFirst(static_cast<uint8_t>(walk.back().second - 1));
        relax(parent, done, byte);
        continue;
      }
      const uint8_t byte = regex_->classFirst(static_cast<uint8_t>(c++));
      const int32_t t = next(s, byte);
      if (to_accept_[t] == kNever) continue;
      if (walked[t] == 1) {  // A cycle: as long as wanted.
        to_longest_[s] = kUnbounded;
      } else if (walked[t] == 2) {
        relax(s, t, byte);
      } else {
        walked[t] = 1;
        to_longest_[t] = accepting_[t] ? 0 : kNever;
        walk.push_back({t, 0});
      }
    }
  }
  return true;
}

absl::StatusOr<std::shared_ptr<const Regex>> outputPattern(std::string_view regex,
                                                           const std::vector<std::string>& choice) {
  if (regex.empty() && choice.empty()) return nullptr;
  if (!regex.empty() && !choice.empty())
    return absl::InvalidArgumentError("sampling.regex and sampling.choice cannot both be set");
  if (regex.size() > kMaxRegexBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.regex must be at most 64 KiB, got ", regex.size(), " bytes"));
  }
  if (choice.size() > kMaxChoices) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.choice must have at most ",
                                                   kMaxChoices, " entries, got ", choice.size()));
  }
  std::string pattern;
  for (size_t i = 0; i < choice.size(); ++i) {
    if (choice[i].empty() || choice[i].size() > kMaxChoiceBytes) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.choice[", i, "] must be 1 to ",
                                                     kMaxChoiceBytes, " bytes, got ",
                                                     choice[i].size()));
    }
    absl::StrAppend(&pattern, i == 0 ? "" : "|", Regex::escape(choice[i]));
  }
  absl::StatusOr<std::shared_ptr<const Regex>> compiled =
      Regex::compile(choice.empty() ? regex : pattern);
  if (!compiled.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        choice.empty() ? "sampling.regex: " : "sampling.choice: ", compiled.status().message()));
  }
  return compiled;
}

void Regex::close(std::vector<int32_t>& states) const {
  std::vector<int32_t> stack(states.begin(), states.end());
  std::vector<int32_t> out;
  std::vector<bool> seen(states_.size(), false);
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    if (s < 0 || seen[s]) continue;
    seen[s] = true;
    const State& state = states_[s];
    if (state.kind == State::Kind::kFork) {
      stack.push_back(state.alt);
      stack.push_back(state.next);
    } else if (state.kind != State::Kind::kByte || state.lo <= state.hi) {
      out.push_back(s);  // (A range of no byte, an empty class, leads nowhere: left out.)
    }
  }
  std::sort(out.begin(), out.end());
  states = std::move(out);
}

bool Regex::fullMatch(std::string_view text) const {
  std::vector<int32_t> set{start_};
  close(set);
  for (char c : text) {
    const auto b = static_cast<uint8_t>(c);
    std::vector<int32_t> next;
    for (int32_t s : set) {
      const State& state = states_[s];
      if (state.kind == State::Kind::kByte && b >= state.lo && b <= state.hi)
        next.push_back(state.next);
    }
    close(next);
    if (next.empty()) return false;
    set = std::move(next);
  }
  return std::any_of(set.begin(), set.end(),
                     [&](int32_t s) { return states_[s].kind == State::Kind::kMatch; });
}

}  // namespace cleave::engine
