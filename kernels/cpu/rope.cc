#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>

namespace cleave::cpu {

absl::Status ropeSupported(const model::RopeScaling& scaling) {
  if (scaling.type == "none" || scaling.type == "linear" || scaling.type == "llama3" ||
      scaling.type == "yarn" || scaling.type == "longrope") {
    return absl::OkStatus();
  }
  return absl::UnimplementedError("rope scaling \"" + scaling.type + "\" is not implemented yet");
}

int64_t rotaryDim(const model::ModelConfig& config) {
  if (config.mla) return config.mla->qk_rope_head_dim;
  return config.rotary_dim > 0 ? config.rotary_dim : config.head_dim;
}

Rope::Rope(const model::ModelConfig& config, RopePairing pairing)
    : head_dim_(rotaryDim(config)), pairing_(pairing), inv_freq_(rotaryDim(config) / 2) {
  const double base = config.rope_theta;
  const model::RopeScaling& s = config.rope_scaling;
  // longrope: one set of factors for every position, chosen by the context served.
  const std::vector<double>& longrope =
      config.max_position_embeddings > s.original_max_position_embeddings ? s.long_factor
                                                                          : s.short_factor;
  for (int64_t i = 0; i < head_dim_ / 2; ++i) {
    double inv = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(head_dim_));
    if (s.type == "longrope") {
      inv /= longrope[i];
      attention_factor_ = s.attention_factor.value_or(1.0);
    } else if (s.type == "linear") {
      inv /= s.factor;
    } else if (s.type == "llama3") {
      // Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
      const double low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
      const double high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
      const double wavelen = 2.0 * M_PI / inv;
      if (wavelen > low_wavelen) {
        inv /= s.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        inv = (1.0 - smooth) * inv / s.factor + smooth * inv;
      }
    }
    inv_freq_[i] = static_cast<float>(inv);
  }
  if (s.type == "yarn") yarn(config);
}

namespace {

// YaRN's attention temperature for a context stretched `scale` times.
double yarnMscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

void Rope::yarn(const model::ModelConfig& config) {
  // Dimensions that turn fewer than beta_slow times over the original context are
  // interpolated (frequency / factor), those turning more than beta_fast times kept, the
  // ones between blended linearly.
  const model::RopeScaling& s = config.rope_scaling;
  const double dim = static_cast<double>(head_dim_), base = config.rope_theta;
  auto correctionDim = [&](double rotations) {
    return dim * std::log(s.original_max_position_embeddings / (rotations * 2 * M_PI)) /
           (2 * std::log(base));
  };
  double low = correctionDim(s.beta_fast), high = correctionDim(s.beta_slow);
  if (s.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < head_dim_ / 2; ++i) {
    const double extrapolated =
        1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(head_dim_));
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double keep = 1.0 - ramp;
    inv_freq_[i] = static_cast<float>(extrapolated / s.factor * (1.0 - keep) + extrapolated * keep);
  }
  attention_factor_ = s.attention_factor ? *s.attention_factor
                      : (s.mscale != 0 && s.mscale_all_dim != 0)
                          ? yarnMscale(s.factor, s.mscale) / yarnMscale(s.factor, s.mscale_all_dim)
                          : yarnMscale(s.factor, 1.0);
}

void Rope::angles(const int32_t* positions, int64_t tokens, RopeAngles& out) const {
  const int64_t half = head_dim_ / 2;
  out.cos.resize(tokens * half);
  out.sin.resize(tokens * half);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * inv_freq_[i];
      out.cos[t * half + i] = static_cast<float>(std::cos(angle) * attention_factor_);
      out.sin[t * half + i] = static_cast<float>(std::sin(angle) * attention_factor_);
    }
  }
}

void Rope::apply(float* x, int64_t ld, int64_t tokens, int64_t heads, const RopeAngles& angles,
                 int64_t first) const {
  apply(x, ld, tokens, heads, angles, first, head_dim_);
}

void Rope::apply(float* x, int64_t ld, int64_t tokens, int64_t heads, const RopeAngles& angles,
                 int64_t first, int64_t head_stride) const {
  const int64_t half = head_dim_ / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* cos_v = angles.cos.data() + (first + t) * half;
    const float* sin_v = angles.sin.data() + (first + t) * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * ld + h * head_stride;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = pairing_ == RopePairing::kHalves ? i : 2 * i;
        const int64_t b = pairing_ == RopePairing::kHalves ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * cos_v[i] - x1 * sin_v[i];
        v[b] = x0 * sin_v[i] + x1 * cos_v[i];
      }
    }
  }
}

std::optional<Rope> slidingRope(const model::ModelConfig& config, RopePairing pairing) {
  if (config.sliding_rope_theta <= 0) return std::nullopt;
  model::ModelConfig local = config;
  local.rope_theta = config.sliding_rope_theta;
  local.rope_scaling = model::RopeScaling();
  return Rope(local, pairing);
}

void Rope::apply(float* x, int64_t ld, int64_t tokens, int64_t heads,
                 const int32_t* positions) const {
  RopeAngles table;
  angles(positions, tokens, table);
  apply(x, ld, tokens, heads, table, 0);
}

}  // namespace cleave::cpu
