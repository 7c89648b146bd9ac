// Rotary position embeddings applied in place to query or key heads.
//
// For head dimension D and pair index i < D/2, the angle at position p is
// p * theta_i with theta_i = base^(-2i/D), adjusted by the model's rope scaling ("linear",
// the "llama3" frequency bands, "yarn" with its attention factor on cos and sin, or
// "longrope"'s factor per pair — its long or short set, by the context the model is served
// with — and attention factor; ropeSupported() says which). Two pairings exist:
//   kHalves   (x[i], x[i + D/2])  — Hugging Face checkpoints ("rotate_half")
//   kAdjacent (x[2i], x[2i + 1])  — GGUF llama-family files, whose Q/K weights are
//                                   permuted at conversion to match
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "common/model/model_config.h"

namespace cleave::cpu {

enum class RopePairing { kHalves, kAdjacent };

// OK for the rope scalings Rope implements; Unimplemented naming the type otherwise.
absl::Status ropeSupported(const model::RopeScaling& scaling);

// cos and sin of every (token, pair) angle of a step, [tokens, head_dim / 2] each:
// computed once per step and shared by every layer.
struct RopeAngles {
  std::vector<float> cos;
  std::vector<float> sin;
};

// The dimensions of a head that rotate: MLA's qk_rope_head_dim, else the leading
// config.rotary_dim (GLM-4.5's half), else all of head_dim.
int64_t rotaryDim(const model::ModelConfig& config);

// Rotates heads of rotaryDim(config) values (for MLA: the rope part, laid out as its own
// heads by the caller).
class Rope {
 public:
  Rope(const model::ModelConfig& config, RopePairing pairing);

  // x: [tokens, heads * head_dim] with row stride ld; positions[t] is token t's position.
  void apply(float* x, int64_t ld, int64_t tokens, int64_t heads, const int32_t* positions) const;

  // The angles of `tokens` tokens at `positions`.
  void angles(const int32_t* positions, int64_t tokens, RopeAngles& out) const;
  // Rotates `tokens` rows of x whose angles are rows [first, first + tokens) of `angles`.
  void apply(float* x, int64_t ld, int64_t tokens, int64_t heads, const RopeAngles& angles,
             int64_t first) const;
  // The same for heads `head_stride` values apart (the rotary part of wider heads).
  void apply(float* x, int64_t ld, int64_t tokens, int64_t heads, const RopeAngles& angles,
             int64_t first, int64_t head_stride) const;

  const std::vector<float>& inverseFrequencies() const { return inv_freq_; }
  // What cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
  double attentionFactor() const { return attention_factor_; }

 private:
  void yarn(const model::ModelConfig& config);

  int64_t head_dim_;
  RopePairing pairing_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  double attention_factor_ = 1.0;
};

// The rotation of the sliding-window layers of a model whose base differs from the other
// layers' (Gemma 3: ModelConfig::sliding_rope_theta, no rope scaling); none otherwise.
std::optional<Rope> slidingRope(const model::ModelConfig& config, RopePairing pairing);

}  // namespace cleave::cpu
