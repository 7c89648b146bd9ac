// Grouped expert GEMM on the tensor cores (mma.sync, f32 accumulation): every tile of a
// MoeLayout (moe_layout.h) multiplies its rows by its expert's weight matrix.
//
//   y[r][n] = sum_c x[src(r)][c] * W[e(r)][n][c]        n < out width, c < K
//
// src(r) is the token of row r's pair (gather: the gate/up projection reads the hidden
// states of tokens) or r itself (the down projection reads the previous product's rows).
// With silu_mul the weight holds gate rows [0, I) then up rows [I, 2I) and
//   y[r][n] = act(gate[r][n], up[r][n])                   n < I
// (GatedActivation: SiLU(gate) * up, or gpt-oss's clamped SwiGLU) so the intermediate never
// leaves the kernel unactivated. A bias per weight row and expert (gpt-oss's experts; a
// dense layer's bias) joins each product before the activation.
//
// Weight formats (all experts of a layer in one array, expert-major):
//   bf16   [E][N][K]
//   fp8    e4m3 [E][N][K] with f32 scales per 128 x 128 block [E][ceil(N/128)][K/128]
//          (DeepSeek-V3 style); partial sums over each 128-column block are scaled, as
//          the format defines, and added (W8A16)
//   nvfp4  E2M1 codes two per byte [E][N][K/2] (element 2k in the low nibble), e4m3 scales
//          per 16 consecutive elements [E][N][K/16], and an f32 scale per row [E][N]: the
//          checkpoint's global scale of the row's matrix (a multiplier: compressed-tensors'
//          reciprocal is inverted at load), per row so a fused gate/up keeps both globals.
//          Codes times their e4m3 scale are exact in bf16; the row scale multiplies the
//          accumulator (W4A16, runs on sm_90 as on sm_120)
// Activations and outputs are bf16. Tiles of 16 rows stream the weights for decode-size
// batches (a few rows per expert); tiles of 64 rows reuse each weight tile four times for
// prefill. Both need K % 32 == 0 (fp8: K % 128 == 0), an even out width, strides % 8 == 0.
//
// Operands (GemmOperands): quantized weights are widened to bf16 in shared memory and meet
// bf16 activations on the bf16 MMA (W8A16, W4A16: any device), or the activations are
// quantized per row like the weights (quantize_rows.h) into caller-given scratch and both
// go to the tensor cores as stored: e4m3 MMA for fp8 (W8A8; native on sm_120, emulated on
// sm_90) and the block-scaled E2M1 MMA for nvfp4 (W4A4; sm_120a kernels, K % 64 == 0).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/moe_layout.h"

namespace cleave::cuda {

enum class ExpertWeightFormat { kBf16, kFp8Block128, kNvfp4 };

const char* expertWeightFormatName(ExpertWeightFormat format);

struct ExpertWeights {
  ExpertWeightFormat format = ExpertWeightFormat::kBf16;
  int experts = 0;
  int64_t rows = 0;  // N per expert (2I for a fused gate/up)
  int64_t cols = 0;  // K
  const void* data = nullptr;
  const float* block_scales = nullptr;    // fp8
  const uint8_t* group_scales = nullptr;  // nvfp4, e4m3
  const float* row_scales = nullptr;      // nvfp4, [E][N]
};

enum class GemmOperands {
  kAuto,     // native where the device runs it natively and the scratch suffices, else widened
  kWidened,  // bf16 activations, weights widened to bf16
  kNative,   // activations quantized like the weights; an error where that cannot run
};
const char* gemmOperandsName(GemmOperands operands);

// Scratch bytes for the native operands of `rows` rows of K (0 for bf16 weights).
int64_t nativeScratchBytes(ExpertWeightFormat format, int64_t rows, int64_t k);
// Whether kAuto picks the native operands for `format` on the current device (given
// scratch and a shape they take).
bool nativeOperandsPreferred(ExpertWeightFormat format);

// The activation of a fused gate/up product: SiLU(gate) * up; with limit > 0, gpt-oss's
// clamped SwiGLU (up' + 1) * g * sigmoid(alpha * g), g = min(gate, limit),
// up' = clamp(up, -limit, limit) (model::MoeConfig::swiglu_limit).
struct GatedActivation {
  float limit = 0.0f;
  float alpha = 1.702f;
};

struct MoeGemmArgs {
  const MoeLayoutPlan* plan = nullptr;
  MoeLayout layout;
  const void* x = nullptr;  // bf16
  int64_t x_stride = 0;
  bool gather = false;  // x rows are tokens (pair / k); otherwise layout rows
  ExpertWeights weights;
  const void* bias = nullptr;  // bf16 [experts][weights.rows], or null
  bool silu_mul = false;
  GatedActivation activation;  // of silu_mul
  void* y = nullptr;           // bf16 [plan->max_rows][out width]
  int64_t y_stride = 0;
  // Native operands: x quantized into scratch first (gather: `tokens` rows of x; otherwise
  // the layout's rows), nativeScratchBytes(format, those rows, K) bytes, 256-byte aligned.
  GemmOperands operands = GemmOperands::kAuto;
  int64_t tokens = 0;
  void* scratch = nullptr;
  int64_t scratch_bytes = 0;
};

// The same kernels over one matrix (weights.experts == 1) and `rows` rows of x in order,
// no layout: a skinny GEMM for decode-size batches (rows <= 16 read each weight once, in
// 16-row tiles) that also runs FP8 and NVFP4 dense weights; larger batches use 64-row
// tiles. y is [rows][out width].
struct SkinnyGemmArgs {
  const void* x = nullptr;  // bf16
  int64_t x_stride = 0;
  int64_t rows = 0;
  ExpertWeights weights;
  bool silu_mul = false;
  void* y = nullptr;  // bf16
  int64_t y_stride = 0;
  const void* bias = nullptr;                   // bf16 [weights.rows], added before the activation
  GemmOperands operands = GemmOperands::kAuto;  // as MoeGemmArgs, over `rows` rows
  void* scratch = nullptr;
  int64_t scratch_bytes = 0;
};

absl::Status runSkinnyGemm(const SkinnyGemmArgs& args, cudaStream_t stream);

// Sets the kernels' shared-memory limits; call once before runMoeGemm or runSkinnyGemm (and
// before a graph capture).
absl::Status prepareMoeGemm();

// Enqueues the product; the grid covers plan->max_tiles. InvalidArgument names the
// shape or field that the kernels cannot take.
absl::Status runMoeGemm(const MoeGemmArgs& args, cudaStream_t stream);

}  // namespace cleave::cuda
