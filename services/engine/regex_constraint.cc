#include "services/engine/regex_constraint.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace cleave::engine {

template <class Dfa>
AutomatonConstraint<Dfa>::AutomatonConstraint(std::shared_ptr<const TokenBytes> bytes,
                                              std::vector<uint32_t> ends,
                                              std::shared_ptr<const typename Dfa::Source> source)
    : bytes_(std::move(bytes)),
      ends_(std::move(ends)),
      dfa_(std::move(source), kMaxDfaStates),
      current_(dfa_.start()) {}

template <class Dfa>
bool AutomatonConstraint<Dfa>::alive(int32_t state, std::string_view bytes) const {
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int32_t next = dfa_.step(state, static_cast<uint8_t>(bytes[i]));
    if (next == Dfa::kDead) return false;
    if (next == Dfa::kFull) {  // On through NFA sets, uncached.
      typename Dfa::Set set = dfa_.set(state);
      for (size_t j = i; j < bytes.size() && !set.empty(); ++j)
        set = dfa_.stepSet(set, static_cast<uint8_t>(bytes[j]));
      return !set.empty();
    }
    state = next;
  }
  return true;
}

template <class Dfa>
void AutomatonConstraint<Dfa>::mask(std::span<float> logits) const {
  if (auto it = masks_.find(current_);
      it != masks_.end() && it->second.size() == (logits.size() + 63) / 64) {
    constexpr float kNever = -std::numeric_limits<float>::infinity();
    bool any = false;
    for (size_t w = 0; w < it->second.size(); ++w) {
      const uint64_t bits = it->second[w];
      const size_t base = w * 64, n = std::min<size_t>(64, logits.size() - base);
      any = any || bits != 0;
      if (bits == 0) {
        std::fill_n(logits.begin() + static_cast<ptrdiff_t>(base), n, kNever);
      } else if (bits != ~uint64_t{0}) {
        for (size_t i = 0; i < n; ++i) {
          if (((bits >> i) & 1) == 0) logits[base + i] = kNever;
        }
      }
    }
    if (!any && !ends_.empty() && ends_[0] < logits.size()) logits[ends_[0]] = 0.0f;
    return;
  }
  keep_.assign(logits.size(), 0);
  const TokenBytes& bytes = *bytes_;
  for (int first = 0; first < 256; ++first) {
    const std::vector<uint32_t>& ids = bytes.startingWith(static_cast<uint8_t>(first));
    if (ids.empty() || dfa_.step(current_, static_cast<uint8_t>(first)) == Dfa::kDead) continue;
    for (uint32_t id : ids) {
      if (id < keep_.size()) keep_[id] = alive(current_, bytes[id]);
    }
  }
  for (uint32_t end : ends_) {
    if (end < keep_.size()) keep_[end] = matched();
  }
  if (masks_.size() >= kMaxCachedMasks) masks_.clear();
  std::vector<uint64_t>& bits = masks_[current_];
  bits.assign((keep_.size() + 63) / 64, 0);
  for (size_t id = 0; id < keep_.size(); ++id) bits[id / 64] |= uint64_t{keep_[id]} << (id % 64);
  keepOnly(keep_, ends_, logits);
}

template <class Dfa>
bool AutomatonConstraint<Dfa>::accept(uint32_t token) {
  if (std::find(ends_.begin(), ends_.end(), token) != ends_.end()) return matched();
  if (token >= bytes_->size() || (*bytes_)[token].empty()) return false;
  typename Dfa::Set set = dfa_.set(current_);
  for (char c : (*bytes_)[token]) {
    set = dfa_.stepSet(set, static_cast<uint8_t>(c));
    if (set.empty()) return false;
  }
  // The state of `set`: cached, or the cache started afresh from it.
  int32_t state = current_;
  for (char c : (*bytes_)[token]) {
    state = dfa_.step(state, static_cast<uint8_t>(c));
    if (state == Dfa::kFull) break;
  }
  if (state == Dfa::kFull) {
    masks_.clear();
    state = dfa_.reset(std::move(set));
  }
  current_ = state;
  return true;
}

template class AutomatonConstraint<RegexDfa>;
template class AutomatonConstraint<GrammarDfa>;

}  // namespace cleave::engine
