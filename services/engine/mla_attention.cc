#include "services/engine/mla_attention.h"

#include <cmath>
#include <cstring>
#include <memory>

#include "common/status_macros.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/kv_format.h"
#include "services/engine/checked_matmul.h"

namespace cleave::engine {
namespace {

// A float matrix of `rows` x `cols` owned by the matrix itself.
absl::StatusOr<cpu::CpuMatrix> floatMatrix(std::vector<float> values, int64_t rows, int64_t cols) {
  auto owned = std::make_shared<std::vector<float>>(std::move(values));
  return cpu::CpuMatrix::create({.type = model::TensorType::kF32,
                                 .rows = rows,
                                 .cols = cols,
                                 .data = reinterpret_cast<const uint8_t*>(owned->data())},
                                owned);
}

}  // namespace

absl::Status absorbKvB(std::shared_ptr<const cpu::CpuMatrix> kv_b, const model::MlaConfig& mla,
                       int64_t heads, MlaWeights& w) {
  const int64_t nope = mla.qk_nope_head_dim, v = mla.v_head_dim, lora = mla.kv_lora_rank;
  const cpu::WeightMatrix& stored = kv_b->source();
  // W_UKᵀ is a transposed copy: bf16 when the checkpoint is (exactly its values), else float.
  const bool bf16 = stored.type == model::TensorType::kBF16;
  w.k_absorb.clear();
  w.v_up.clear();
  std::vector<float> rows(nope * lora);
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t first = h * (nope + v);
    CLEAVE_RETURN_IF_ERROR(cpu::dequantizeRows(stored, first, first + nope, rows.data()));
    std::vector<float> uk_t(lora * nope);  // [lora][nope]
    for (int64_t i = 0; i < nope; ++i) {
      for (int64_t j = 0; j < lora; ++j) uk_t[j * nope + i] = rows[i * lora + j];
    }
    if (bf16) {
      auto owned = std::make_shared<std::vector<uint16_t>>(uk_t.size());
      for (size_t i = 0; i < uk_t.size(); ++i) (*owned)[i] = cpu::floatToBf16(uk_t[i]);
      CLEAVE_ASSIGN_OR_RETURN(
          cpu::CpuMatrix k,
          cpu::CpuMatrix::create({.type = model::TensorType::kBF16,
                                  .rows = lora,
                                  .cols = nope,
                                  .data = reinterpret_cast<const uint8_t*>(owned->data())},
                                 owned));
      w.k_absorb.push_back(std::move(k));
    } else {
      CLEAVE_ASSIGN_OR_RETURN(cpu::CpuMatrix k, floatMatrix(std::move(uk_t), lora, nope));
      w.k_absorb.push_back(std::move(k));
    }
    // W_UV is the head's value rows as stored, read in place.
    cpu::WeightMatrix value = stored;
    value.data += (first + nope) * stored.rowBytes();
    value.rows = v;
    value.scales.row_offset += first + nope;
    CLEAVE_ASSIGN_OR_RETURN(cpu::CpuMatrix up, cpu::CpuMatrix::create(value, kv_b));
    w.v_up.push_back(std::move(up));
  }
  return absl::OkStatus();
}

float mlaSoftmaxScale(const model::ModelConfig& c) {
  double scale = 1.0 / std::sqrt(double(c.mla->qk_nope_head_dim + c.mla->qk_rope_head_dim));
  const model::RopeScaling& r = c.rope_scaling;
  if (r.type != "none" && r.mscale_all_dim != 0 && r.factor > 1) {
    const double m = 0.1 * r.mscale_all_dim * std::log(r.factor) + 1.0;
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

MlaAttention::MlaAttention(const model::ModelConfig& config, int64_t heads, cpu::ThreadPool& pool)
    : config_(config),
      mla_(*config.mla),
      heads_(heads),
      pool_(pool),
      scale_(mlaSoftmaxScale(config)) {}

void MlaAttention::forward(const MlaWeights& w, const Step& s, KvStorage& cache, int64_t layer,
                           float kv_scale, float* out) {
  const int64_t n = s.tokens, hidden = config_.hidden_size;
  const int64_t nope = mla_.qk_nope_head_dim, rope = mla_.qk_rope_head_dim;
  const int64_t lora = mla_.kv_lora_rank, v_dim = mla_.v_head_dim;
  const int64_t qk = nope + rope, row = lora + rope;  // A head's query; a latent row.
  const int64_t q_dim = heads_ * qk, abs_dim = heads_ * row;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  q_.resize(n * q_dim);
  latent_.resize(n * row);
  q_abs_.resize(n * abs_dim);
  attended_.resize(n * abs_dim);

  // The query's first product (low-rank q_a, or the full-rank q_b) and the latent rows read the
  // same input: one job.
  const int64_t q_low = w.q_a.rows();
  q_low_.resize(n * q_low);
  if (q_low > 0) {
    checkedMatmulsOfOneInput(
        s.x, hidden, n, {{&w.q_a, q_low_.data(), q_low}, {&w.kv_a, latent_.data(), row}}, pool_);
    cpu::rmsNorm(q_low_.data(), q_low, w.q_a_norm.data(), n, q_low, eps, q_low_.data(), q_low);
    checkedMatmul(w.q_b, q_low_.data(), q_low, n, q_.data(), q_dim, pool_);
  } else {
    checkedMatmulsOfOneInput(s.x, hidden, n,
                             {{&w.q_b, q_.data(), q_dim}, {&w.kv_a, latent_.data(), row}}, pool_);
  }

  // The latent rows: c normalized, k_pe rotated; then into the cache.
  cpu::rmsNorm(latent_.data(), row, w.kv_a_norm.data(), n, lora, eps, latent_.data(), row);
  s.rope->apply(latent_.data() + lora, row, n, 1, *s.angles, 0);
  uint8_t* keys = cache.keys(layer);
  const cpu::KvType kv_type = cache.type();
  const int64_t element = cpu::kvElementBytes(kv_type), block_size = cache.blockSize();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t block = s.block_tables[i][s.positions[i] / block_size];
    const int64_t at = (block * block_size + s.positions[i] % block_size) * row * element;
    cpu::encodeKv(kv_type, latent_.data() + i * row, row, kv_scale, keys + at);
  }

  // Absorbed queries [W_UKᵀ q_nope, rotated q_pe], one row of `row` per head.
  for (int64_t h = 0; h < heads_; ++h) {
    checkedMatmul(w.k_absorb[h], q_.data() + h * qk, q_dim, n, q_abs_.data() + h * row, abs_dim,
                  pool_);
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(q_abs_.data() + t * abs_dim + h * row + lora,
                  q_.data() + t * q_dim + h * qk + nope, rope * sizeof(float));
    }
  }
  s.rope->apply(q_abs_.data() + lora, abs_dim, n, heads_, *s.angles, 0, row);

  cpu::attention({.q = q_abs_.data(),
                  .ldq = abs_dim,
                  .tokens = n,
                  .positions = s.positions,
                  .block_tables = s.block_tables,
                  .k_pool = keys,
                  .v_pool = keys,
                  .kv_type = kv_type,
                  .k_scale = kv_scale,
                  .v_scale = kv_scale,
                  .block_size = block_size,
                  .heads = heads_,
                  .kv_heads = 1,
                  .head_dim = row,
                  .scale = scale_,
                  .out = attended_.data(),
                  .ldo = abs_dim},
                 pool_);
  // Each head's attended latent (its first lora values) through W_UV.
  for (int64_t h = 0; h < heads_; ++h) {
    checkedMatmul(w.v_up[h], attended_.data() + h * row, abs_dim, n, out + h * v_dim,
                  heads_ * v_dim, pool_);
  }
}

}  // namespace cleave::engine
