// Multi-head latent attention (DeepSeek-V2/V3, model::MlaConfig) on the CPU, in its
// absorbed form: the cache holds one latent row per position (kv_lora_rank normalized
// values c, then qk_rope_head_dim rotated key values k_pe), and kv_b_proj is folded into
// the query and the output instead of expanding every cached position into heads.
//
// For head h, with kv_b_proj's rows for h split into W_UK (qk_nope_head_dim rows) and W_UV
// (v_head_dim rows):
//   score(t) = q_nope . (W_UK c_t) + q_pe . k_pe_t = [W_UKᵀ q_nope, q_pe] . [c_t, k_pe_t]
//   out      = sum_t p_t W_UV c_t               = W_UV (sum_t p_t c_t)
// so attention runs as one cached head of kv_lora_rank + qk_rope_head_dim shared by every
// query head, whose value rows are the first kv_lora_rank elements of its key rows.
//
// In a tensor-parallel group every rank computes the latent of every token (its cache is
// all of it) and attends with its run of query heads; o_proj's product is a partial sum.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/thread_pool.h"
#include "services/engine/kv_storage.h"

namespace cleave::engine {

// One layer's MLA projections for one rank's `heads` query heads (o_proj stays in the
// layer as wo: [hidden, heads * v_head_dim]).
struct MlaWeights {
  cpu::CpuMatrix q_a;            // [q_lora_rank, hidden]; no rows without low-rank Q
  std::vector<float> q_a_norm;   // [q_lora_rank]
  cpu::CpuMatrix q_b;            // [heads * qk_head_dim, q_lora_rank] (q_proj: [.., hidden])
  cpu::CpuMatrix kv_a;           // [kv_lora_rank + qk_rope_head_dim, hidden]
  std::vector<float> kv_a_norm;  // [kv_lora_rank]
  std::vector<cpu::CpuMatrix> k_absorb;  // Per head, W_UKᵀ: [kv_lora_rank, qk_nope_head_dim]
  std::vector<cpu::CpuMatrix> v_up;      // Per head, W_UV:  [v_head_dim, kv_lora_rank]
};

// Splits kv_b_proj ([heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank], this rank's
// heads) into `w`'s per-head k_absorb (a transposed copy: bf16 for a bf16 checkpoint, float
// otherwise) and v_up (kv_b's own rows in their stored format; they keep `kv_b` alive).
absl::Status absorbKvB(std::shared_ptr<const cpu::CpuMatrix> kv_b, const model::MlaConfig& mla,
                       int64_t heads, MlaWeights& w);

// Softmax scale of the scores: qk_head_dim^-1/2, times DeepSeek's yarn mscale squared.
float mlaSoftmaxScale(const model::ModelConfig& config);

// Runs the attention part of MLA layers for one rank. Threading: one caller; kernels
// spread over `pool`.
class MlaAttention {
 public:
  MlaAttention(const model::ModelConfig& config, int64_t heads, cpu::ThreadPool& pool);

  struct Step {
    const float* x = nullptr;  // [tokens, hidden], the normed residual stream
    int64_t tokens = 0;
    const int32_t* positions = nullptr;            // [tokens]
    const int32_t* const* block_tables = nullptr;  // [tokens]
    const cpu::Rope* rope = nullptr;               // Of qk_rope_head_dim
    const cpu::RopeAngles* angles = nullptr;       // Of `positions`
  };
  // Writes each token's latent row into layer `layer` of `cache` (one part, one head of
  // kv_lora_rank + qk_rope_head_dim; e4m3 rows divided by `kv_scale`), attends, and leaves
  // the heads' outputs, [tokens, heads * v_head_dim], in `out`.
  void forward(const MlaWeights& w, const Step& step, KvStorage& cache, int64_t layer,
               float kv_scale, float* out);

 private:
  const model::ModelConfig& config_;
  const model::MlaConfig mla_;
  const int64_t heads_;
  cpu::ThreadPool& pool_;
  const float scale_;
  // Scratch: low-rank Q, the heads' queries, the latent rows, absorbed queries, attended
  // latents.
  std::vector<float> q_low_, q_, latent_, q_abs_, attended_;
};

}  // namespace cleave::engine
