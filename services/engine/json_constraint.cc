#include "services/engine/json_constraint.h"
#include "services/engine/json_grammar_inl.h"

#include <algorithm>
#include <limits>
#include <random>

#include "common/tokenizer/tokenizer.h"

namespace cleave::engine {
TokenBytes::TokenBytes(const tokenizer::Tokenizer& tokenizer) : bytes_(tokenizer.vocabSize()) {
  // A token's bytes in context: what it adds after an ordinary token (a decoder may strip
  // the leading space of a text's first token).
  const std::vector<tokenizer::TokenId> anchor =
      tokenizer.encode("a", {.add_special_tokens = false});
  const std::string before = tokenizer.decode(anchor, true);
  std::vector<tokenizer::TokenId> pair = anchor;
  pair.push_back(0);
  for (uint32_t id = 0; id < bytes_.size(); ++id) {
    if (tokenizer.isSpecial(id)) continue;
    pair.back() = id;
    const std::string both = tokenizer.decode(pair, true);
    bytes_[id] =
        both.starts_with(before) ? both.substr(before.size()) : tokenizer.decode({&id, 1}, true);
  }
  // The bytes add up: sample pairs of ordinary tokens decode to their bytes joined.
  std::mt19937_64 random(bytes_.size());
  std::vector<tokenizer::TokenId> three = anchor;
  three.resize(anchor.size() + 2);
  for (int checked = 0, tries = 0; checked < 256 && tries < 4096 && exact_; ++tries) {
    const uint32_t x = random() % bytes_.size(), y = random() % bytes_.size();
    if (bytes_[x].empty() || bytes_[y].empty()) continue;
    three[anchor.size()] = x;
    three[anchor.size() + 1] = y;
    exact_ = tokenizer.decode(three, true) == before + bytes_[x] + bytes_[y];
    ++checked;
  }
  sortIntoGroups();
}

TokenBytes::TokenBytes(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
  sortIntoGroups();
}

void TokenBytes::sortIntoGroups() {
  by_first_.assign(256, {});
  plain_.assign(bytes_.size(), false);
  for (uint32_t id = 0; id < bytes_.size(); ++id) {
    const std::string& b = bytes_[id];
    if (b.empty()) continue;
    by_first_[static_cast<uint8_t>(b[0])].push_back(id);
    // Plain: a grammar between string characters takes it and stays in that string.
    JsonGrammar probe;
    if (b.find_first_of("\"\\") != std::string::npos || !probe.pushAll("{\"")) continue;
    plain_[id] = probe.pushAll(b) && probe.betweenStringCharacters();
  }
  // Within a first byte: one-byte tokens, then by second byte (stable: ids ascending).
  auto second = [&](uint32_t id) {
    return bytes_[id].size() < 2 ? -1 : static_cast<int>(static_cast<uint8_t>(bytes_[id][1]));
  };
  groups_.assign(256 * 258, 0);
  for (int first = 0; first < 256; ++first) {
    std::vector<uint32_t>& ids = by_first_[first];
    std::stable_sort(ids.begin(), ids.end(),
                     [&](uint32_t a, uint32_t b) { return second(a) < second(b); });
    size_t* at = &groups_[static_cast<size_t>(first) * 258];
    for (int k = -1, i = 0; k <= 256; ++k) {
      at[k + 1] = static_cast<size_t>(i);
      while (k < 256 && i < static_cast<int>(ids.size()) && second(ids[i]) == k) ++i;
    }
  }
}

JsonConstraint::JsonConstraint(std::shared_ptr<const TokenBytes> bytes, std::vector<uint32_t> ends,
                               std::shared_ptr<const JsonSchema> schema)
    : bytes_(std::move(bytes)),
      ends_(std::move(ends)),
      schema_(std::move(schema)),
      grammar_(schema_.get()) {}

namespace {

// Marks in `keep` the tokens whose bytes `grammar` (not complete) takes: tokens grouped by
// first byte, then by second, a refused group skipped whole; between string characters,
// plain text at once.
template <class Grammar>
void allowed(const Grammar& grammar, const TokenBytes& bytes, std::vector<uint8_t>& keep) {
  const bool in_string = grammar.betweenStringCharacters();
  auto mark = [&](uint32_t id, bool allowed) {
    if (id < keep.size()) keep[id] = allowed;
  };
  for (int first = 0; first < 256; ++first) {
    const std::vector<uint32_t>& ids = bytes.startingWith(static_cast<uint8_t>(first));
    if (ids.empty()) continue;
    Grammar next = grammar;
    if (!next.push(static_cast<uint8_t>(first))) continue;
    if (in_string) {  // nearly everything goes: plain text at once, the rest simulated
      for (uint32_t id : ids) {
        if (bytes.plainText(id)) {
          mark(id, true);
          continue;
        }
        Grammar rest = grammar;
        mark(id, rest.pushAll(bytes[id]));
      }
      continue;
    }
    const auto [single, single_end] = bytes.group(static_cast<uint8_t>(first), -1);
    for (size_t i = single; i < single_end; ++i) mark(ids[i], true);
    for (int second = 0; second < 256; ++second) {
      const auto [begin, end] = bytes.group(static_cast<uint8_t>(first), second);
      if (begin == end) continue;
      Grammar two = next;
      if (!two.push(static_cast<uint8_t>(second))) continue;
      for (size_t i = begin; i < end; ++i) {
        Grammar rest = two;
        mark(ids[i], rest.pushAll(std::string_view(bytes[ids[i]]).substr(2)));
      }
    }
  }
}

}  // namespace

void JsonConstraint::mask(std::span<float> logits) const {
  keep_.assign(logits.size(), 0);
  if (!grammar_.complete()) {
    // Without a schema, the plain syntax (a smaller state to copy per token).
    if (const JsonGrammar* plain = grammar_.plain(); plain != nullptr) {
      allowed(*plain, *bytes_, keep_);
    } else {
      allowed(grammar_, *bytes_, keep_);
    }
  }
  for (uint32_t end : ends_) {
    if (end < logits.size()) keep_[end] = grammar_.complete();
  }
  keepOnly(keep_, ends_, logits);
}

bool JsonConstraint::accept(uint32_t token) {
  if (std::find(ends_.begin(), ends_.end(), token) != ends_.end()) return grammar_.complete();
  return token < bytes_->size() && !(*bytes_)[token].empty() && grammar_.pushAll((*bytes_)[token]);
}

}  // namespace cleave::engine
