#include "services/engine/regex_nfa.h"

#include <algorithm>

namespace cleave::engine {
namespace {

int utf8Length(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

void encode(uint32_t c, uint8_t* out) {
  const int n = utf8Length(c);
  static constexpr uint8_t kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  for (int i = n - 1; i > 0; --i) {
    out[i] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    c >>= 6;
  }
  out[0] = static_cast<uint8_t>(kLead[n] | c);
}

using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;

// The UTF-8 encodings of [lo, hi] (no surrogates inside) as sequences of byte ranges, each
// sequence a product: every byte string it stands for encodes a code point of the range.
void utf8Sequences(uint32_t lo, uint32_t hi, std::vector<ByteRanges>& out) {
  for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= max && hi > max) {
      utf8Sequences(lo, max, out);
      utf8Sequences(max + 1, hi, out);
      return;
    }
  }
  const int n = utf8Length(lo);
  // Split until, below each continuation byte, lo and hi agree or span the whole range.
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8Sequences(lo, lo | m, out);
        utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8Sequences(lo, (hi & ~m) - 1, out);
        utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  encode(lo, a);
  encode(hi, b);
  ByteRanges seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out.push_back(std::move(seq));
}

}  // namespace

void normalize(CharSet& set) {
  std::sort(set.begin(), set.end());
  CharSet merged;
  for (const auto& r : set) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  set = std::move(merged);
}

// Every scalar value (surrogates are not characters) outside `set`.
CharSet complement(const CharSet& set) {
  CharSet out;
  uint32_t from = 0;
  for (const auto& [lo, hi] : set) {
    if (lo > from) out.push_back({from, lo - 1});
    from = hi + 1;
  }
  if (from <= kMaxCodepoint) out.push_back({from, kMaxCodepoint});
  return out;
}

bool decodeUtf8(std::string_view text, size_t& pos, uint32_t& cp) {
  const auto b = static_cast<uint8_t>(text[pos]);
  const int n = b < 0x80 ? 1 : b >= 0xF0 && b < 0xF5 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 ? 2 : 0;
  cp = n == 1 ? b : n == 2 ? b & 0x1F : n == 3 ? b & 0x0F : b & 0x07;
  bool ok = n > 0;
  for (int i = 1; i < n && ok; ++i) {
    const auto next = pos + i < text.size() ? static_cast<uint8_t>(text[pos + i]) : 0;
    ok = (next & 0xC0) == 0x80;
    cp = (cp << 6) | (next & 0x3F);
  }
  const bool overlong = (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000);
  ok = ok && !overlong && cp <= kMaxCodepoint && !(cp >= 0xD800 && cp <= 0xDFFF);
  if (!ok) {
    cp = 0;
    return false;
  }
  pos += static_cast<size_t>(n);
  return true;
}

void classifyBytes(const std::vector<Regex::State>& states, std::array<uint8_t, 256>& byte_class,
                   std::vector<uint8_t>& class_first) {
  std::array<bool, 257> starts{};  // A byte where some state's range begins or ends after.
  starts[0] = true;
  for (const Regex::State& state : states) {
    if (state.kind != Regex::State::Kind::kByte) continue;
    starts[state.lo] = true;
    starts[state.hi + 1] = true;
  }
  int32_t c = -1;
  for (int byte = 0; byte < 256; ++byte) {
    if (starts[byte]) {
      ++c;
      class_first.push_back(static_cast<uint8_t>(byte));
    }
    byte_class[byte] = static_cast<uint8_t>(c);
  }
}

bool matchesOnlyEmpty(const NfaNode& node) {
  switch (node.kind) {
    case NfaNode::Kind::kEmpty: return true;
    case NfaNode::Kind::kConcat:
    case NfaNode::Kind::kAlt:
      return std::all_of(node.children.begin(), node.children.end(), matchesOnlyEmpty);
    case NfaNode::Kind::kRepeat: return node.max == 0 || matchesOnlyEmpty(node.children[0]);
    default: return false;
  }
}

int32_t NfaEmitter::add(Regex::State s) {
  if (static_cast<int64_t>(states_->size()) >= Regex::kMaxStates) {
    full_ = true;
    return 0;
  }
  states_->push_back(s);
  return static_cast<int32_t>(states_->size() - 1);
}

int32_t NfaEmitter::fork(int32_t next, int32_t alt) {
  return add({.kind = Regex::State::Kind::kFork, .next = next, .alt = alt});
}

int32_t NfaEmitter::emit(const NfaNode& node, int32_t out) {
  if (full_) return out;
  switch (node.kind) {
    case NfaNode::Kind::kEmpty: return out;
    case NfaNode::Kind::kSet: {
      std::vector<ByteRanges> sequences;
      for (const auto& [lo, hi] : node.set) {
        // Around the surrogates, which have no encoding.
        if (lo < 0xD800) utf8Sequences(lo, std::min(hi, 0xD7FFu), sequences);
        if (hi > 0xDFFF) utf8Sequences(std::max(lo, 0xE000u), hi, sequences);
      }
      int32_t entry = -1;
      for (const ByteRanges& seq : sequences) {
        int32_t at = out;
        for (auto it = seq.rbegin(); it != seq.rend(); ++it) {
          at = add(
              {.kind = Regex::State::Kind::kByte, .lo = it->first, .hi = it->second, .next = at});
        }
        entry = entry < 0 ? at : fork(at, entry);
      }
      // An empty set (a class of nothing) matches nothing: a byte range no byte is in.
      return entry >= 0 ? entry
                        : add({.kind = Regex::State::Kind::kByte, .lo = 1, .hi = 0, .next = out});
    }
    case NfaNode::Kind::kCall:  // The callee's start is set once every rule is emitted.
      return add({.kind = Regex::State::Kind::kCall, .next = out, .alt = node.rule});
    case NfaNode::Kind::kConcat: {
      int32_t at = out;
      for (auto it = node.children.rbegin(); it != node.children.rend(); ++it) at = emit(*it, at);
      return at;
    }
    case NfaNode::Kind::kAlt: {
      int32_t entry = emit(node.children.back(), out);
      for (size_t i = node.children.size() - 1; i-- > 0;)
        entry = fork(emit(node.children[i], out), entry);
      return entry;
    }
    case NfaNode::Kind::kRepeat: {
      const NfaNode& child = node.children[0];
      // Repeats of nothing are nothing (emitting them count by count would take as long
      // as the counts multiply).
      if (node.max == 0 || matchesOnlyEmpty(child)) return out;
      int32_t at = out;
      if (node.max < 0) {  // child*: a fork back into the child or on
        const int32_t loop = fork(-1, out);
        const int32_t entry = emit(child, loop);
        (*states_)[loop].next = entry;
        at = loop;
      } else {  // (child (child (...)?)?)?, max - min deep
        for (int i = node.min; i < node.max; ++i) at = fork(emit(child, at), out);
      }
      for (int i = 0; i < node.min; ++i) at = emit(child, at);
      return at;
    }
  }
  return out;
}

}  // namespace cleave::engine
