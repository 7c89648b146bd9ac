#include "common/tokenizer/bpe_model.h"

#include <queue>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/tokenizer/utf8.h"

namespace cleave::tokenizer {
namespace {

// Words up to this many symbols merge by rescanning the pair ranks (no heap, no allocation
// beyond the symbol vector); longer ones use a priority queue.
constexpr size_t kSmallWord = 48;
constexpr uint32_t kNoRank = UINT32_MAX;

// Whether word[i] is not part of a well-formed UTF-8 sequence.
bool isIllFormedAt(absl::string_view word, size_t i) {
  size_t pos = 0;
  while (pos <= i) {
    const size_t n = utf8SequenceLength(word, pos);
    if (n == 0) {
      if (pos == i) return true;
      ++pos;
    } else {
      if (i < pos + n) return false;
      pos += n;
    }
  }
  return true;
}

// Whether text[at] directly follows a "▁".
bool followsMarker(absl::string_view text, size_t at) {
  constexpr absl::string_view kMarker = "\u2581";
  return at >= kMarker.size() && text.substr(at - kMarker.size(), kMarker.size()) == kMarker;
}

}  // namespace

BpeModel::BpeModel(BpeModelOptions options) : options_(std::move(options)) {
  byte_unit_ids_.fill(-1);
  fallback_ids_.fill(-1);
}

void BpeModel::addToken(absl::string_view key, TokenId id) { vocab_.try_emplace(key, id); }

std::optional<TokenId> BpeModel::find(absl::string_view key) const {
  auto it = vocab_.find(key);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::addMerge(TokenId left, TokenId right, TokenId merged, uint32_t rank, bool replace) {
  const Merge merge{.rank = rank, .merged = merged};
  if (replace) {
    merges_.insert_or_assign(pairKey(left, right), merge);
  } else {
    merges_.try_emplace(pairKey(left, right), merge);
  }
}

void BpeModel::finalize() {
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    if (options_.unit_mode == UnitMode::kBytes || b < 0x80) {
      if (auto id = find(absl::string_view(&c, 1))) byte_unit_ids_[b] = *id;
    }
    if (auto id = find(absl::StrFormat("<0x%02X>", b))) fallback_ids_[b] = *id;
  }
  replacement_units_ = options_.unit_mode == UnitMode::kBytes && byte_unit_ids_[0xEF] >= 0 &&
                       byte_unit_ids_[0xBF] >= 0 && byte_unit_ids_[0xBD] >= 0;
  // SentencePiece-style text arrives as one word. When no token has "▁" after another
  // character, no merge can cross the start of a "▁" run, so words are cut there.
  split_at_marker_ = options_.unit_mode != UnitMode::kBytes &&
                     options_.continuing_subword_prefix.empty() &&
                     options_.end_of_word_suffix.empty() && find(kMarker).has_value();
  for (const auto& [key_string, id] : vocab_) {
    if (!split_at_marker_) break;
    const absl::string_view key = key_string;
    for (size_t at = key.find(kMarker, 1); at != absl::string_view::npos;
         at = key.find(kMarker, at + 1)) {
      if (!followsMarker(key, at)) {
        split_at_marker_ = false;
        break;
      }
    }
  }
}

void BpeModel::initialSymbols(absl::string_view word, std::vector<Symbol>* symbols) const {
  symbols->clear();
  auto push = [&](TokenId id) {
    const auto index = static_cast<int32_t>(symbols->size());
    symbols->push_back(Symbol{.id = id, .prev = index - 1, .next = index + 1});
  };
  const bool affixes =
      !options_.continuing_subword_prefix.empty() || !options_.end_of_word_suffix.empty();
  if (options_.unit_mode == UnitMode::kBytes && !affixes) {
    for (size_t i = 0; i < word.size(); ++i) {
      const char c = word[i];
      const int64_t id = byte_unit_ids_[static_cast<uint8_t>(c)];
      if (id >= 0) {
        push(static_cast<TokenId>(id));
      } else if (replacement_units_ && isIllFormedAt(word, i)) {
        // An ill-formed byte the vocabulary cannot spell (0xFF in a vocabulary trained on
        // valid UTF-8) reads as U+FFFD, as llama.cpp reads every ill-formed byte.
        for (uint8_t b : {0xEF, 0xBF, 0xBD}) push(static_cast<TokenId>(byte_unit_ids_[b]));
      } else if (options_.byte_fallback && fallback_ids_[static_cast<uint8_t>(c)] >= 0) {
        push(static_cast<TokenId>(fallback_ids_[static_cast<uint8_t>(c)]));
      } else if (options_.unk_id) {
        if (!(options_.fuse_unk && !symbols->empty() && symbols->back().id == *options_.unk_id)) {
          push(*options_.unk_id);
        }
      }
    }
  } else {
    // Unknown units are held as a pending unknown token (fused when asked) until the next
    // known unit, as the reference implementation orders them.
    std::optional<TokenId> pending_unk;
    std::string key;
    size_t pos = 0;
    while (pos < word.size()) {
      size_t n = 1;
      switch (options_.unit_mode) {
        case UnitMode::kBytes: n = 1; break;
        case UnitMode::kUtf8Chars: n = utf8UnitLength(word, pos); break;
        case UnitMode::kUtf8LeadLength: n = utf8LeadLength(word, pos); break;
      }
      const bool first = pos == 0;
      const bool last = pos + n == word.size();
      const absl::string_view unit = word.substr(pos, n);
      pos += n;
      std::optional<TokenId> id;
      absl::string_view lookup = unit;
      if (!affixes || (first && last && options_.end_of_word_suffix.empty())) {
        if (n == 1 && byte_unit_ids_[static_cast<uint8_t>(unit[0])] >= 0) {
          id = static_cast<TokenId>(byte_unit_ids_[static_cast<uint8_t>(unit[0])]);
        } else if (n > 1 || static_cast<uint8_t>(unit[0]) >= 0x80) {
          id = find(unit);
        }
      } else {
        key.clear();
        if (!first) key += options_.continuing_subword_prefix;
        key.append(unit.data(), unit.size());
        if (last) key += options_.end_of_word_suffix;
        lookup = key;
        id = find(key);
      }
      if (id) {
        if (pending_unk) {
          push(*pending_unk);
          pending_unk.reset();
        }
        push(*id);
        continue;
      }
      if (options_.byte_fallback) {
        bool all = true;
        for (char c : lookup) all = all && fallback_ids_[static_cast<uint8_t>(c)] >= 0;
        if (all) {
          for (char c : lookup) push(static_cast<TokenId>(fallback_ids_[static_cast<uint8_t>(c)]));
          continue;
        }
      }
      if (options_.unk_id) {
        if (pending_unk && !options_.fuse_unk) push(*pending_unk);
        pending_unk = options_.unk_id;
      }
    }
    if (pending_unk) push(*pending_unk);
  }
  if (!symbols->empty()) symbols->back().next = -1;
}

void BpeModel::mergeSmall(std::vector<Symbol>* symbols) const {
  // Symbols stay compact here: ids only, pair ranks recomputed next to each merge.
  std::vector<Symbol>& s = *symbols;
  size_t n = s.size();
  uint32_t ranks[kSmallWord];
  TokenId merged[kSmallWord];
  auto rankAt = [&](size_t i) {
    const Merge* m = findMerge(s[i].id, s[i + 1].id);
    ranks[i] = m ? m->rank : kNoRank;
    merged[i] = m ? m->merged : 0;
  };
  for (size_t i = 0; i + 1 < n; ++i) rankAt(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == kNoRank) break;
    s[best].id = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      s[i] = s[i + 1];
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) rankAt(best - 1);
    if (best + 1 < n) {
      rankAt(best);
    } else {
      ranks[best] = kNoRank;
    }
  }
  s.resize(n);
}

void BpeModel::mergeLarge(std::vector<Symbol>* symbols) const {
  std::vector<Symbol>& s = *symbols;
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    TokenId left;
    TokenId right;
    TokenId merged;
    // Lowest rank first, then leftmost.
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t next = s[pos].next;
    if (next < 0) return;
    if (const Merge* m = findMerge(s[pos].id, s[next].id)) {
      queue.push(Candidate{.rank = m->rank,
                           .pos = pos,
                           .left = s[pos].id,
                           .right = s[next].id,
                           .merged = m->merged});
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(s.size()); ++i) consider(i);
  std::vector<bool> removed(s.size(), false);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    if (removed[c.pos]) continue;
    const int32_t next = s[c.pos].next;
    if (next < 0 || s[c.pos].id != c.left || s[next].id != c.right) continue;  // Stale.
    s[c.pos].id = c.merged;
    removed[next] = true;
    s[c.pos].next = s[next].next;
    if (s[next].next >= 0) s[s[next].next].prev = c.pos;
    consider(s[c.pos].prev);
    consider(c.pos);
  }
  size_t out = 0;
  for (int32_t i = s.empty() ? -1 : 0; i >= 0; i = s[i].next) s[out++].id = s[i].id;
  s.resize(out);
}

void BpeModel::encodeWord(absl::string_view word, std::vector<TokenId>* out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (auto id = find(word)) {
      out->push_back(*id);
      return;
    }
  }
  if (!split_at_marker_) {
    encodePiece(word, out);
    return;
  }
  // Cut before each "▁" that follows another character.
  size_t begin = 0;
  for (size_t at = word.find(kMarker, 1); at != absl::string_view::npos;
       at = word.find(kMarker, at + kMarker.size())) {
    if (followsMarker(word, at)) continue;
    if (at > begin) encodePiece(word.substr(begin, at - begin), out);
    begin = at;
  }
  encodePiece(word.substr(begin), out);
}

void BpeModel::encodePiece(absl::string_view word, std::vector<TokenId>* out) const {
  thread_local std::vector<Symbol> symbols;
  initialSymbols(word, &symbols);
  if (symbols.size() <= kSmallWord) {
    mergeSmall(&symbols);
  } else {
    mergeLarge(&symbols);
  }
  for (const Symbol& s : symbols) out->push_back(s.id);
}

}  // namespace cleave::tokenizer
