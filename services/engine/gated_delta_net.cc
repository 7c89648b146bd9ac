#include "services/engine/gated_delta_net.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/vector_ops.h"
#include "services/engine/checked_matmul.h"

namespace cleave::engine {
namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// torch's softplus (beta 1, threshold 20).
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// x / sqrt(sum x² + 1e-6), as the reference's l2norm.
void l2Normalize(float* x, int64_t n) {
  const float inverse = 1.0f / std::sqrt(cpu::dot(x, x, n) + 1e-6f);
  for (int64_t i = 0; i < n; ++i) x[i] *= inverse;
}

}  // namespace

int64_t gatedDeltaNetGroupFloats(const model::LinearAttentionConfig& c) {
  const int64_t ratio = c.value_heads / c.key_heads;
  const int64_t channels = 2 * int64_t{c.key_head_dim} + ratio * c.value_head_dim;
  return (c.conv_kernel - 1) * channels + ratio * int64_t{c.key_head_dim} * c.value_head_dim;
}

int64_t gatedDeltaNetStateFloats(const model::LinearAttentionConfig& c, const ShardDims& d) {
  return d.linear_key_heads.size * gatedDeltaNetGroupFloats(c);
}

int64_t linearStateFloats(const model::ModelConfig& c, const ShardDims& d) {
  if (!c.linear_attention) return 0;
  return c.linearLayers() * gatedDeltaNetStateFloats(*c.linear_attention, d);
}

GatedDeltaNet::GatedDeltaNet(const model::ModelConfig& config, const ShardDims& dims,
                             cpu::ThreadPool& pool)
    : c_(*config.linear_attention),
      hidden_(config.hidden_size),
      eps_(static_cast<float>(config.rms_norm_eps)),
      key_heads_(dims.linear_key_heads.size),
      value_heads_(dims.linear_value_heads.size),
      kd_(key_heads_ * c_.key_head_dim),
      vd_(value_heads_ * c_.value_head_dim),
      channels_(2 * kd_ + vd_),
      group_channels_(channels_ / std::max<int64_t>(key_heads_, 1)),
      group_floats_(gatedDeltaNetGroupFloats(c_)),
      pool_(pool) {}

int64_t GatedDeltaNet::convOffset(int64_t ch) const {
  const int64_t dk = c_.key_head_dim;
  int64_t group = 0, at = 0;
  if (ch < kd_) {  // A query channel.
    group = ch / dk, at = ch % dk;
  } else if (ch < 2 * kd_) {  // A key channel.
    group = (ch - kd_) / dk, at = dk + (ch - kd_) % dk;
  } else {  // A value channel: its head's place in its key head's group.
    const int64_t dv = c_.value_head_dim;
    const int64_t h = (ch - 2 * kd_) / dv;
    group = keyHeadOf(h);
    at = 2 * dk + indexInGroup(h) * dv + (ch - 2 * kd_) % dv;
  }
  return group * group_floats_ + at;
}

int64_t GatedDeltaNet::keyHeadOf(int64_t h) const {
  return c_.tiled_value_heads ? h % key_heads_ : h / (value_heads_ / key_heads_);
}

int64_t GatedDeltaNet::indexInGroup(int64_t h) const {
  return c_.tiled_value_heads ? h / key_heads_ : h % (value_heads_ / key_heads_);
}

void GatedDeltaNet::ensureScratch(int64_t rows) {
  mixed_.resize(rows * channels_);
  z_.resize(rows * vd_);
  o_.resize(rows * vd_);
  b_.resize(rows * value_heads_);
  a_.resize(rows * value_heads_);
}

void GatedDeltaNet::ungroup(int64_t rows, bool qkvz, bool ba) {
  const int64_t dk = c_.key_head_dim;
  const int64_t r = value_heads_ / key_heads_;
  const int64_t values = r * c_.value_head_dim;  // One key head's value (and z) columns.
  const int64_t group = 2 * dk + 2 * values;
  auto copy = [](const float* from, int64_t n, float* to) {
    std::memcpy(to, from, n * sizeof(float));
  };
  pool_.parallelFor(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* mixed = mixed_.data() + t * channels_;
      for (int64_t g = 0; g < key_heads_; ++g) {
        if (qkvz) {
          const float* from = grouped_.data() + t * (channels_ + vd_) + g * group;
          copy(from, dk, mixed + g * dk);
          copy(from + dk, dk, mixed + kd_ + g * dk);
          copy(from + 2 * dk, values, mixed + 2 * kd_ + g * values);
          copy(from + 2 * dk + values, values, z_.data() + t * vd_ + g * values);
        }
        if (ba) {
          const float* from = ba_.data() + t * 2 * value_heads_ + g * 2 * r;
          copy(from, r, b_.data() + t * value_heads_ + g * r);
          copy(from + r, r, a_.data() + t * value_heads_ + g * r);
        }
      }
    }
  });
}

void GatedDeltaNet::convolve(const GatedDeltaNetWeights& w, float* rows,
                             const LinearStateRun& run) {
  const int64_t taps = c_.conv_kernel;
  const int64_t history = taps - 1;
  pool_.parallelFor(channels_, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> window(taps);  // The inputs the next output reads, oldest first.
    for (int64_t ch = begin; ch < end; ++ch) {
      const int64_t at = convOffset(ch);  // Its inputs, a row of group_channels_ apart.
      float* kept = run.state + at;
      for (int64_t j = 0; j < history; ++j) window[j] = kept[j * group_channels_];
      const float* weight = w.conv.data() + ch * taps;
      for (int64_t t = 0; t < run.tokens; ++t) {
        float* x = rows + t * channels_ + ch;
        window[history] = *x;
        float sum = 0;
        for (int64_t j = 0; j < taps; ++j) sum += weight[j] * window[j];
        *x = sum * sigmoid(sum);  // SiLU
        for (int64_t j = 0; j < history; ++j) window[j] = window[j + 1];
        if (t < static_cast<int64_t>(run.after_rows.size()) && run.after_rows[t]) {
          for (int64_t j = 0; j < history; ++j)
            run.after_rows[t][at + j * group_channels_] = window[j];
        }
      }
      for (int64_t j = 0; j < history; ++j) kept[j * group_channels_] = window[j];
    }
  });
}

void GatedDeltaNet::recur(const GatedDeltaNetWeights& w, int64_t row, const LinearStateRun& run,
                          int64_t h, int64_t offset) {
  const int64_t dk = c_.key_head_dim, dv = c_.value_head_dim;
  const int64_t kh = keyHeadOf(h);
  const float a_rate = w.a_rate[h];
  float* s = run.state + offset;
  std::vector<float> kv(dv);
  for (int64_t t = row; t < row + run.tokens; ++t) {
    const float* q = mixed_.data() + t * channels_ + kh * dk;
    const float* k = q + kd_;
    const float* v = mixed_.data() + t * channels_ + 2 * kd_ + h * dv;
    const float beta = sigmoid(b_[t * value_heads_ + h]);
    const float decay = std::exp(a_rate * softplus(a_[t * value_heads_ + h] + w.dt_bias[h]));
    // S = decay·S; kv = Sᵀk; S += k ⊗ β(v − kv); o = Sᵀq.
    std::fill(kv.begin(), kv.end(), 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      float* si = s + i * dv;
      for (int64_t j = 0; j < dv; ++j) si[j] *= decay;
      cpu::axpy(k[i], si, kv.data(), dv);
    }
    for (int64_t j = 0; j < dv; ++j) kv[j] = beta * (v[j] - kv[j]);
    float* o = o_.data() + t * vd_ + h * dv;
    std::fill(o, o + dv, 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      float* si = s + i * dv;
      cpu::axpy(k[i], kv.data(), si, dv);
      cpu::axpy(q[i], si, o, dv);
    }
    if (t - row < static_cast<int64_t>(run.after_rows.size()) && run.after_rows[t - row])
      std::memcpy(run.after_rows[t - row] + offset, s, dk * dv * sizeof(float));
  }
}

void GatedDeltaNet::forward(const GatedDeltaNetWeights& w, const float* x,
                            std::span<const LinearStateRun> runs, float* out) {
  int64_t rows = 0;
  for (const LinearStateRun& run : runs) rows += run.tokens;
  ensureScratch(rows);
  // The projections (of one input, in one pool job), grouped ones into their own scratch.
  const bool grouped_qkvz = w.qkvz.rows() > 0, grouped_ba = w.ba.rows() > 0;
  std::array<ProductOutput, 6> products;
  size_t n = 0;
  if (grouped_qkvz) {
    grouped_.resize(rows * (channels_ + vd_));
    products[n++] = {&w.qkvz, grouped_.data(), channels_ + vd_};
  } else {
    products[n++] = {&w.q, mixed_.data(), channels_};
    products[n++] = {&w.k, mixed_.data() + kd_, channels_};
    products[n++] = {&w.v, mixed_.data() + 2 * kd_, channels_};
    products[n++] = {&w.z, z_.data(), vd_};
  }
  if (grouped_ba) {
    ba_.resize(rows * 2 * value_heads_);
    products[n++] = {&w.ba, ba_.data(), 2 * value_heads_};
  } else {
    products[n++] = {&w.b, b_.data(), value_heads_};
    products[n++] = {&w.a, a_.data(), value_heads_};
  }
  checkedMatmulsOfOneInput(x, hidden_, rows, std::span<const ProductOutput>(products.data(), n),
                           pool_);
  if (grouped_qkvz || grouped_ba) ungroup(rows, grouped_qkvz, grouped_ba);
  const int64_t head_floats = int64_t{c_.key_head_dim} * c_.value_head_dim;
  const int64_t conv_floats = (c_.conv_kernel - 1) * group_channels_;  // Of a group.
  int64_t row = 0;
  for (const LinearStateRun& run : runs) {
    if (run.reset) std::memset(run.state, 0, key_heads_ * group_floats_ * sizeof(float));
    convolve(w, mixed_.data() + row * channels_, run);
    row += run.tokens;
  }
  // Queries and keys L2-normed per head, the queries also scaled by 1/√key_head_dim.
  const int64_t dk = c_.key_head_dim;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  pool_.parallelFor(rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* q = mixed_.data() + t * channels_;
      for (int64_t head = 0; head < 2 * key_heads_; ++head) l2Normalize(q + head * dk, dk);
      for (int64_t i = 0; i < kd_; ++i) q[i] *= q_scale;
    }
  });
  // Each run's value heads are independent: one job per (run, head).
  std::vector<std::pair<int64_t, const LinearStateRun*>> starts;
  row = 0;
  for (const LinearStateRun& run : runs) {
    starts.emplace_back(row, &run);
    row += run.tokens;
  }
  pool_.parallelFor(
      static_cast<int64_t>(starts.size()) * value_heads_, 1, [&](int64_t begin, int64_t end) {
        for (int64_t job = begin; job < end; ++job) {
          const auto& [first, run] = starts[job / value_heads_];
          const int64_t h = job % value_heads_;
          recur(w, first, *run, h,
                keyHeadOf(h) * group_floats_ + conv_floats + indexInGroup(h) * head_floats);
        }
      });
  // Each head's output RMS-normed with the shared weights, times SiLU(z).
  const int64_t dv = c_.value_head_dim;
  pool_.parallelFor(rows, 1, [&](int64_t begin, int64_t end) {
    float* o = o_.data() + begin * vd_;
    const float* z = z_.data() + begin * vd_;
    const int64_t heads = (end - begin) * value_heads_;
    cpu::rmsNorm(o, dv, w.norm.data(), heads, dv, eps_, o, dv);
    for (int64_t head = 0; head < heads; ++head)
      cpu::siluMulRow(z + head * dv, o + head * dv, o + head * dv, dv);
  });
  checkedMatmul(w.out, o_.data(), vd_, rows, out, hidden_, pool_);
}

}  // namespace cleave::engine
