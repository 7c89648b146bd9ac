// Choosing the next token from a sequence's logits.
//
// Order of operations: repetition penalty (prompt and output tokens: a positive logit is
// divided by it, a negative one multiplied), presence and frequency penalties (output
// tokens: minus presence if seen, minus frequency x count), then temperature 0 = greedy
// (argmax); otherwise divide by temperature, keep the top_k, keep the smallest set whose
// probability reaches top_p, drop tokens below min_p x the top probability, and draw.
// Output token i draws from a generator seeded by (seed, i), so the same seed gives the
// same output, and a sequence whose first token was drawn by a prefill worker continues on
// a decode worker exactly as it would have in one process (observe() the first token).
// Log-probabilities reported are those of the model's distribution (log-softmax of the
// raw logits), as a client comparing sampling settings expects.
//
// Threading: a Sampler belongs to one sequence and is used by one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace cleave::engine {

// The most top tokens a request may ask log-probabilities of.
inline constexpr int32_t kMaxLogprobs = 20;

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy.
  int32_t top_k = 0;         // 0: off.
  float top_p = 1.0f;        // (0, 1]
  float min_p = 0.0f;        // [0, 1]
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  int32_t logprobs = -1;  // -1: none; n >= 0: the sampled token's and the top n.
};

// OK, or InvalidArgument naming the field and its allowed range.
absl::Status validateSamplingParams(const SamplingParams& params);

// A token a sequence has seen: `count` times in its output (0: only in its prompt).
struct SeenToken {
  uint32_t token = 0;
  int32_t count = 0;
};

// A next token drawn by the step's backend instead (on the GPU, sampling.h): the same
// penalties and truncations in the same order and float arithmetic, log-probabilities of
// the model's distribution summed in float (the CPU sums in double), and the backend's own
// generator keyed by (seed, index), so a seeded draw differs from the CPU's (greedy does
// not: both take the lowest index of the largest penalized logit).
struct DeviceDraw {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  uint64_t index = 0;  // Output tokens drawn before this one.
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // The tokens the penalties touch, each once (empty without penalties): prompt tokens
  // (for the repetition penalty) and output tokens with their counts.
  std::span<const SeenToken> seen;
  int32_t logprobs = -1;  // As SamplingParams::logprobs.
};

struct SampledToken {
  uint32_t token = 0;
  float logprob = 0.0f;                         // When logprobs >= 0.
  std::vector<std::pair<uint32_t, float>> top;  // Best first, when logprobs > 0.
};

// `token`'s log-probability under `logits` (log-softmax, summed in double), and the `top`
// most likely tokens' (best first, lowest id first among equals; none past a masked one).
SampledToken scoreToken(std::span<const float> logits, uint32_t token, int32_t top);

class Sampler {
 public:
  // `params` must be valid. `prompt` feeds the repetition penalty.
  Sampler(const SamplingParams& params, std::span<const uint32_t> prompt);

  // Picks the next token and records it as part of the output.
  SampledToken sample(std::span<const float> logits);
  // Records `token` as the next output token without sampling it (it was sampled
  // elsewhere): it counts for the penalties and advances the draw index.
  void observe(uint32_t token);
  // The next token as a backend may draw it, when nothing needs the logits on the host (no
  // log-probabilities of logits that penalties change); empty otherwise. observe() the
  // token it draws. `seen` points into the sampler, valid until the next observe() or
  // sample().
  std::optional<DeviceDraw> deviceDraw() const;

 private:
  bool penalized() const {
    return params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
           params_.frequency_penalty != 0.0f;
  }

  SamplingParams params_;
  uint64_t index_ = 0;  // Output tokens so far.
  std::unordered_map<uint32_t, int32_t> output_counts_;
  std::vector<uint32_t> prompt_tokens_;  // Distinct prompt tokens.
  // With penalties: the tokens they touch (deviceDraw()'s), and where each is in seen_.
  std::vector<SeenToken> seen_;
  std::unordered_map<uint32_t, int32_t> seen_slot_;
  std::vector<float> scratch_;
  std::vector<uint32_t> order_;
};

}  // namespace cleave::engine
