#include "services/engine/llama_runner.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"

namespace cleave::engine {
namespace {

void checkedMatmul(const cpu::CpuMatrix& w, const float* x, int64_t ldx, int64_t tokens, float* y,
                   int64_t ldy, cpu::ThreadPool& pool) {
  // Shapes are fixed at load; a failure here is a broken invariant, not bad input.
  CLEAVE_CHECK_OK(
      cpu::matmul({.weight = &w, .x = x, .ldx = ldx, .tokens = tokens, .y = y, .ldy = ldy}, pool));
}

}  // namespace

LlamaRunner::LlamaRunner(const LlamaWeights& weights, cpu::ThreadPool& pool, int64_t max_context)
    : w_(weights),
      pool_(pool),
      rope_(weights.config, weights.rope_pairing),
      max_context_(max_context) {
  const int64_t kv_dim = int64_t{w_.config.num_kv_heads} * w_.config.head_dim;
  k_cache_.assign(w_.config.num_layers, std::vector<float>(max_context_ * kv_dim));
  v_cache_.assign(w_.config.num_layers, std::vector<float>(max_context_ * kv_dim));
  logits_.resize(w_.config.vocab_size);
}

void LlamaRunner::ensureScratch(int64_t tokens) {
  const model::ModelConfig& c = w_.config;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  x_.resize(tokens * c.hidden_size);
  h_.resize(tokens * c.hidden_size);
  q_.resize(tokens * q_dim);
  k_.resize(tokens * kv_dim);
  v_.resize(tokens * kv_dim);
  attn_.resize(tokens * q_dim);
  gate_.resize(tokens * c.intermediate_size);
  up_.resize(tokens * c.intermediate_size);
  positions_.resize(tokens);
}

absl::StatusOr<std::span<const float>> LlamaRunner::forward(std::span<const uint32_t> tokens) {
  const model::ModelConfig& c = w_.config;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return absl::InvalidArgumentError("no tokens to run");
  if (position_ + n > max_context_) {
    return absl::OutOfRangeError(absl::StrCat("the sequence would reach ", position_ + n,
                                              " tokens, past the context of ", max_context_));
  }
  for (uint32_t id : tokens) {
    if (id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary (", c.vocab_size, ")"));
    }
  }
  ensureScratch(n);
  const int64_t hidden = c.hidden_size;
  const int64_t head_dim = c.head_dim;
  const int64_t q_dim = int64_t{c.num_heads} * head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * head_dim;
  const int64_t ffn = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Embedding rows, dequantized from the stored table.
  const int64_t row_bytes = w_.token_embd.rowBytes();
  for (int64_t t = 0; t < n; ++t) {
    CLEAVE_CHECK_OK(model::dequantize(w_.token_embd.type,
                                      w_.token_embd.data + tokens[t] * row_bytes, hidden,
                                      x_.data() + t * hidden));
    positions_[t] = static_cast<int32_t>(position_ + t);
  }

  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const LlamaLayer& layer = w_.layers[l];
    cpu::rmsNorm(x_.data(), hidden, layer.attn_norm.data(), n, hidden, eps, h_.data(), hidden);
    checkedMatmul(layer.wq, h_.data(), hidden, n, q_.data(), q_dim, pool_);
    checkedMatmul(layer.wk, h_.data(), hidden, n, k_.data(), kv_dim, pool_);
    checkedMatmul(layer.wv, h_.data(), hidden, n, v_.data(), kv_dim, pool_);
    rope_.apply(q_.data(), q_dim, n, c.num_heads, positions_.data());
    rope_.apply(k_.data(), kv_dim, n, c.num_kv_heads, positions_.data());
    std::memcpy(k_cache_[l].data() + position_ * kv_dim, k_.data(), n * kv_dim * sizeof(float));
    std::memcpy(v_cache_[l].data() + position_ * kv_dim, v_.data(), n * kv_dim * sizeof(float));
    cpu::attention({.q = q_.data(),
                    .ldq = q_dim,
                    .tokens = n,
                    .positions = positions_.data(),
                    .k = k_cache_[l].data(),
                    .v = v_cache_[l].data(),
                    .ldkv = kv_dim,
                    .heads = c.num_heads,
                    .kv_heads = c.num_kv_heads,
                    .head_dim = head_dim,
                    .scale = 1.0f / std::sqrt(static_cast<float>(head_dim)),
                    .out = attn_.data(),
                    .ldo = q_dim},
                   pool_);
    checkedMatmul(layer.wo, attn_.data(), q_dim, n, h_.data(), hidden, pool_);
    cpu::addInPlace(x_.data(), hidden, h_.data(), hidden, n, hidden);

    cpu::rmsNorm(x_.data(), hidden, layer.ffn_norm.data(), n, hidden, eps, h_.data(), hidden);
    checkedMatmul(layer.w_gate, h_.data(), hidden, n, gate_.data(), ffn, pool_);
    checkedMatmul(layer.w_up, h_.data(), hidden, n, up_.data(), ffn, pool_);
    cpu::siluMul(gate_.data(), up_.data(), ffn, n, ffn, gate_.data(), ffn);
    checkedMatmul(layer.w_down, gate_.data(), ffn, n, h_.data(), hidden, pool_);
    cpu::addInPlace(x_.data(), hidden, h_.data(), hidden, n, hidden);
  }

  // Only the last token's logits are needed to continue the sequence.
  const float* last = x_.data() + (n - 1) * hidden;
  cpu::rmsNorm(last, hidden, w_.output_norm.data(), 1, hidden, eps, h_.data(), hidden);
  checkedMatmul(w_.output, h_.data(), hidden, 1, logits_.data(), c.vocab_size, pool_);
  position_ += n;
  return std::span<const float>(logits_);
}

}  // namespace cleave::engine
