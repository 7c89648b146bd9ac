// A mixture-of-experts MLP on the GPU, the MoE layers of CudaLlamaModel: router product
// (cuBLASLt, f32 logits), fused routing (kernels/cuda/moe_routing.h; gpt-oss's router bias
// added there), the token layout in 16-row tiles for decode steps and 64-row tiles for
// prefill (moe_layout.h), the fused gate/up and the down grouped GEMMs (moe_gemm.h; gpt-oss's
// expert biases and clamped SwiGLU in their epilogues), then the routing-weighted combine with
// the shared experts' output (a dense MLP through cuBLASLt) added in the same pass.
//
// Expert weights keep their checkpoint format where a kernel reads it (and where the
// device has the native MMA, the activations are quantized to meet them there: W8A8 on
// sm_120, W4A4 on sm_120a; moe_gemm.h):
//   NVFP4 (E2M1 codes, e4m3 scales per 16, a global per matrix) natively, when hidden and
//         intermediate sizes are multiples of 32;
//   FP8 with 128 x 128 block scales natively, when both sizes are multiples of 128 (so the
//         fused gate/up keeps whole blocks);
//   anything else dequantized to bf16.
// Every step's sizes are fixed at create time (the plans cover the most tokens of a step),
// so decode steps with MoE layers are captured in CUDA graphs like dense ones.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe_gemm.h"
#include "kernels/cuda/moe_layout.h"
#include "services/engine/cuda_arena.h"
#include "services/engine/moe_block.h"
#include "services/engine/tensor_parallel.h"

namespace cleave::engine {

struct CudaMoeShape {
  model::MoeConfig routing;  // over all experts (the router's view)
  int64_t hidden = 0;
  int64_t inter = 0;  // per expert
  // This rank's experts [expert_begin, expert_begin + local_experts) and columns of the
  // shared experts (0 without); all of them on one GPU.
  int64_t expert_begin = 0;
  int64_t local_experts = 0;
  int64_t shared_inter = 0;
  // Qwen3.5-MoE: the shared experts' output times σ(h · shared_gate) (MoeBlock::shared_gate).
  bool shared_gate = false;
  // gpt-oss: a bias on the router's logits; biases on the experts' gate and up rows, and on
  // their down rows where this rank holds each expert's first intermediate columns (a
  // partial sum elsewhere); its clamped SwiGLU.
  bool router_bias = false;
  bool gate_up_bias = false;
  bool down_bias = false;
  cuda::GatedActivation activation;
  cuda::ExpertWeightFormat format = cuda::ExpertWeightFormat::kBf16;
  cuda::GemmOperands operands = cuda::GemmOperands::kAuto;  // of the expert GEMMs
  cuda::MoeLayoutPlan decode_plan;   // 16-row tiles, for the rows of a decode step
  cuda::MoeLayoutPlan prefill_plan;  // 64-row tiles, for the tokens of any step
  int64_t experts() const { return local_experts; }
  int64_t k() const { return routing.experts_per_token; }
};

// The shape of `config`'s MoE layers on the rank of `dims` for steps of at most
// `max_tokens` tokens (decode steps: `max_decode` rows), experts stored in `blocks`' common
// format — bf16 (widened at upload) where any of their experts' matrices differs, as in a
// checkpoint that left some layers unquantized — or, with no blocks, in `format` (random
// weights). Errors name what the kernels cannot take.
absl::StatusOr<CudaMoeShape> cudaMoeShape(const model::ModelConfig& config, const ShardDims& dims,
                                          std::span<const MoeBlock* const> blocks,
                                          cuda::ExpertWeightFormat format, int64_t max_tokens,
                                          int64_t max_decode);

// Device pieces of one layer's weights.
struct CudaMoeWeights {
  __nv_bfloat16* router = nullptr;        // [all experts][hidden]
  float* score_bias = nullptr;            // [all experts], DeepSeek-V3's correction bias, or null
  float* router_bias = nullptr;           // [all experts], or null
  cuda::ExpertWeights gate_up;            // [experts][2 inter][hidden]: gate rows, then up rows
  __nv_bfloat16* gate_up_bias = nullptr;  // [experts][2 inter], or null
  cuda::ExpertWeights down;               // [experts][hidden][inter]
  __nv_bfloat16* down_bias = nullptr;     // [experts][hidden], or null
  __nv_bfloat16* shared_gu = nullptr;     // [2 shared_inter][hidden], or null
  __nv_bfloat16* shared_down = nullptr;   // [hidden][shared_inter]
  float* shared_gate = nullptr;           // [hidden], with CudaMoeShape::shared_gate
};

// The step workspace every MoE layer uses in turn.
struct CudaMoeWorkspace {
  float* router_logits = nullptr;       // [max_tokens][all experts]
  int32_t* expert_ids = nullptr;        // [max_tokens][k]
  float* route_weights = nullptr;       // [max_tokens][k]
  void* layout = nullptr;               // either plan's layout arrays
  __nv_bfloat16* act = nullptr;         // [max_rows][inter]
  __nv_bfloat16* y = nullptr;           // [max_rows][hidden]
  __nv_bfloat16* shared_gu = nullptr;   // [max_tokens][2 shared_inter]
  __nv_bfloat16* shared_out = nullptr;  // [max_tokens][hidden]
  // Quantized experts: the activations quantized for the native products, either GEMM's.
  void* quantized = nullptr;
  int64_t quantized_bytes = 0;
};

// Arena passes (cuda_arena.h): where one layer's weights and the shared workspace go.
CudaMoeWeights placeMoeWeights(Arena& arena, const CudaMoeShape& shape);
CudaMoeWorkspace placeMoeWorkspace(Arena& arena, const CudaMoeShape& shape);

// Uploads `block` (this rank's experts) into `dst`.
absl::Status uploadMoe(const MoeBlock& block, const CudaMoeShape& shape, const CudaMoeWeights& dst);
// Random weights for benchmarks (bf16, NVFP4 or 128x128-block FP8), scaled like an
// initializer.
absl::Status fillRandomMoe(const CudaMoeShape& shape, const CudaMoeWeights& dst, uint64_t seed,
                           cudaStream_t stream);

// out[t] = MoE(h[t]) for the n rows of a step (decode steps use the 16-row plan); on a
// tensor-parallel rank, the partial sum of its experts and shared columns.
absl::Status enqueueMoe(const CudaMoeShape& shape, const CudaMoeWeights& w,
                        const CudaMoeWorkspace& ws, const __nv_bfloat16* h, int64_t n, bool decode,
                        __nv_bfloat16* out, cuda::Gemm& gemm, cudaStream_t stream);

// Bytes of one layer's weights as stored on the GPU, and of one expert's (gate/up and down
// with their scales: what a step reads per expert it routes to).
int64_t moeWeightBytes(const CudaMoeShape& shape);
int64_t moeExpertBytes(const CudaMoeShape& shape);

}  // namespace cleave::engine
