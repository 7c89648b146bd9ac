#include "services/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_set>

#include "absl/strings/str_cat.h"

namespace cleave::engine {
namespace {

absl::Status bad(absl::string_view field, absl::string_view rule, double value) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", rule, ", got ", value));
}

// log-softmax of `logits` at `token`, in double for accuracy.
double logSoftmaxAt(std::span<const float> logits, uint32_t token, double peak, double log_total) {
  return double(logits[token]) - peak - log_total;
}

}  // namespace

absl::Status validateSamplingParams(const SamplingParams& p) {
  if (!(std::isfinite(p.temperature) && p.temperature >= 0))
    return bad("temperature", "must be >= 0", p.temperature);
  if (p.top_k < 0) return bad("top_k", "must be >= 0 (0 disables it)", p.top_k);
  if (!(p.top_p > 0 && p.top_p <= 1)) return bad("top_p", "must be in (0, 1]", p.top_p);
  if (!(p.min_p >= 0 && p.min_p <= 1)) return bad("min_p", "must be in [0, 1]", p.min_p);
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0)) {
    return bad("repetition_penalty", "must be > 0 (1 disables it)", p.repetition_penalty);
  }
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2))
    return bad("presence_penalty", "must be in [-2, 2]", p.presence_penalty);
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2))
    return bad("frequency_penalty", "must be in [-2, 2]", p.frequency_penalty);
  if (p.logprobs < -1 || p.logprobs > kMaxLogprobs)
    return bad("logprobs", absl::StrCat("must be in [0, ", kMaxLogprobs, "] (or -1 for none)"),
               p.logprobs);
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params, std::span<const uint32_t> prompt) : params_(params) {
  std::unordered_set<uint32_t> seen(prompt.begin(), prompt.end());
  prompt_tokens_.assign(seen.begin(), seen.end());
  // The tokens a backend's penalties touch, kept as they change (one step's upload, no
  // rebuilding): the prompt's for the repetition penalty, then each new output token.
  if (params_.repetition_penalty != 1.0f) {
    for (uint32_t t : prompt_tokens_) {
      seen_slot_.emplace(t, static_cast<int32_t>(seen_.size()));
      seen_.push_back({.token = t, .count = 0});
    }
  }
}

void Sampler::observe(uint32_t token) {
  ++output_counts_[token];
  ++index_;
  if (penalized()) {
    const auto [slot, added] = seen_slot_.emplace(token, static_cast<int32_t>(seen_.size()));
    if (added) seen_.push_back({.token = token, .count = 0});
    ++seen_[slot->second].count;
  }
}

std::optional<DeviceDraw> Sampler::deviceDraw() const {
  // Log-probabilities are of the unpenalized logits, which the backend changes in place.
  if (params_.logprobs >= 0 && penalized()) return std::nullopt;
  return DeviceDraw{.temperature = params_.temperature,
                    .top_k = params_.top_k,
                    .top_p = params_.top_p,
                    .min_p = params_.min_p,
                    .seed = params_.seed,
                    .index = index_,
                    .repetition_penalty = params_.repetition_penalty,
                    .presence_penalty = params_.presence_penalty,
                    .frequency_penalty = params_.frequency_penalty,
                    .seen = seen_,
                    .logprobs = params_.logprobs};
}

SampledToken Sampler::sample(std::span<const float> logits) {
  const uint32_t vocab = static_cast<uint32_t>(logits.size());
  scratch_.assign(logits.begin(), logits.end());
  std::vector<float>& l = scratch_;
  if (params_.repetition_penalty != 1.0f) {
    auto penalize = [&](uint32_t t) {
      if (t < vocab)
        l[t] = l[t] > 0 ? l[t] / params_.repetition_penalty : l[t] * params_.repetition_penalty;
    };
    std::unordered_set<uint32_t> done;
    for (uint32_t t : prompt_tokens_) done.insert(t), penalize(t);
    for (const auto& [t, count] : output_counts_) {
      if (done.insert(t).second) penalize(t);
    }
  }
  for (const auto& [t, count] : output_counts_) {
    if (t < vocab)
      l[t] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
  }

  uint32_t chosen;
  if (params_.temperature == 0.0f) {
    chosen = static_cast<uint32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  } else {
    // Candidates sorted by logit, best first; only as many as the filters can keep. With
    // no top-k and no top-p nothing needs sorting: index order serves (min_p needs only
    // the top probability, which is the peak).
    // Masked tokens (-infinity: a constrained row's) are no candidates.
    order_.clear();
    for (uint32_t i = 0; i < vocab; ++i) {
      if (l[i] != -std::numeric_limits<float>::infinity()) order_.push_back(i);
    }
    if (order_.empty()) {
      order_.resize(vocab);
      std::iota(order_.begin(), order_.end(), 0u);
    }
    const uint32_t candidates = static_cast<uint32_t>(order_.size());
    const uint32_t keep =
        params_.top_k > 0 ? std::min<uint32_t>(params_.top_k, candidates) : candidates;
    const bool sorted = keep < candidates || params_.top_p < 1.0f;
    if (sorted) {
      std::partial_sort(
          order_.begin(), order_.begin() + keep, order_.end(),
          [&](uint32_t a, uint32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    } else {
      std::iter_swap(order_.begin(),
                     std::max_element(order_.begin(), order_.end(),
                                      [&](uint32_t a, uint32_t b) { return l[a] < l[b]; }));
    }
    order_.resize(keep);
    const double peak = l[order_[0]];
    std::vector<double> probs(keep);
    double total = 0;
    for (uint32_t i = 0; i < keep; ++i)
      total += probs[i] = std::exp((double(l[order_[i]]) - peak) / params_.temperature);
    uint32_t n = keep;
    if (params_.top_p < 1.0f) {
      double cumulative = 0;
      for (uint32_t i = 0; i < keep; ++i) {
        cumulative += probs[i] / total;
        if (cumulative >= params_.top_p) {
          n = i + 1;
          break;
        }
      }
    }
    if (params_.min_p > 0.0f) {
      const double threshold = params_.min_p * probs[0];
      if (sorted) {
        while (n > 1 && probs[n - 1] < threshold) --n;
      } else {
        for (uint32_t i = 1; i < n; ++i) {
          if (probs[i] < threshold) probs[i] = 0;
        }
      }
    }
    double kept = 0;
    for (uint32_t i = 0; i < n; ++i) kept += probs[i];
    // splitmix64 of (seed, index): independent streams per output position.
    uint64_t z = params_.seed + (index_ + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    std::mt19937_64 rng(z ^ (z >> 31));
    double draw = std::uniform_real_distribution<double>(0.0, kept)(rng);
    chosen = order_[n - 1];
    for (uint32_t i = 0; i < n; ++i) {
      if ((draw -= probs[i]) < 0) {
        chosen = order_[i];
        break;
      }
    }
  }
  observe(chosen);

  if (params_.logprobs >= 0) return scoreToken(logits, chosen, params_.logprobs);
  return SampledToken{.token = chosen};
}

SampledToken scoreToken(std::span<const float> logits, uint32_t token, int32_t top) {
  SampledToken result{.token = token};
  const uint32_t vocab = static_cast<uint32_t>(logits.size());
  const double peak = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (float v : logits) total += std::exp(double(v) - peak);
  const double log_total = std::log(total);
  result.logprob = static_cast<float>(logSoftmaxAt(logits, token, peak, log_total));
  if (top > 0) {
    const uint32_t n = std::min<uint32_t>(top, vocab);
    std::vector<uint32_t> best(vocab);
    std::iota(best.begin(), best.end(), 0u);
    std::partial_sort(best.begin(), best.begin() + n, best.end(), [&](uint32_t a, uint32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (uint32_t i = 0; i < n; ++i) {
      if (!std::isfinite(logits[best[i]])) break;  // masked: no alternative at all
      result.top.emplace_back(best[i],
                              static_cast<float>(logSoftmaxAt(logits, best[i], peak, log_total)));
    }
  }
  return result;
}

}  // namespace cleave::engine
