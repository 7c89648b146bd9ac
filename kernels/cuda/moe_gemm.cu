#include "kernels/cuda/moe_gemm.h"

#include <string>

#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe_gemm_kernel.cuh"
#include "kernels/cuda/quantize_rows.h"

namespace cleave::cuda {
namespace {

using moe_gemm::Format;
using moe_gemm::Params;

RowQuantization rowQuantization(Format format) {
  return format == Format::kNvfp4 ? RowQuantization::kNvfp4 : RowQuantization::kFp8Block128;
}

// The current device's compute capability major (0 without one), asked once per device so
// that a graph capture makes no query.
int computeMajor() {
  static std::array<std::atomic<int>, 64> known{};
  const int major = moe_gemm::onceForDevice(known, [](int device) {
    int value = 0;
    if (cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
      value = 0;
    return value;
  });
  return major < 0 ? 0 : major;
}

}  // namespace

const char* expertWeightFormatName(ExpertWeightFormat format) {
  switch (format) {
    case Format::kBf16: return "bf16";
    case Format::kFp8Block128: return "fp8 (128x128 blocks)";
    case Format::kNvfp4: return "nvfp4";
  }
  return "unknown";
}

const char* gemmOperandsName(GemmOperands operands) {
  switch (operands) {
    case GemmOperands::kAuto: return "auto";
    case GemmOperands::kWidened: return "widened";
    case GemmOperands::kNative: return "native";
  }
  return "unknown";
}

int64_t nativeScratchBytes(ExpertWeightFormat format, int64_t rows, int64_t k) {
  if (format == Format::kBf16) return 0;
  return quantizedRowsBytes(rowQuantization(format), rows, k);
}

bool nativeOperandsPreferred(ExpertWeightFormat format) {
  switch (format) {
    case Format::kBf16: return false;
    case Format::kFp8Block128: return computeMajor() >= 12;  // QMMA; sm_90 emulates it
    case Format::kNvfp4: return moe_gemm::nativeFp4Available();
  }
  return false;
}

absl::Status prepareMoeGemm() {
  using moe_gemm::allowAll;
  for (absl::Status s :
       {allowAll<Format::kBf16, false>(), allowAll<Format::kFp8Block128, false>(),
        allowAll<Format::kNvfp4, false>(), allowAll<Format::kFp8Block128, true>()}) {
    if (!s.ok()) return s;
  }
  (void)computeMajor();  // Asked now, so that a graph capture asks nothing.
  if (moe_gemm::nativeFp4Available()) return moe_gemm::allowNativeFp4();
  return absl::OkStatus();
}

namespace {

// Checks the weights and strides every product needs; the output width on success.
absl::StatusOr<int64_t> checkProduct(const ExpertWeights& w, const void* x, int64_t x_stride,
                                     bool silu_mul, const void* y, int64_t y_stride,
                                     const char* op) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(std::string(op) + " (" + expertWeightFormatName(w.format) +
                                      "): " + what);
  };
  if (x == nullptr || y == nullptr || w.data == nullptr)
    return bad("x, y and weights are required");
  const int64_t align = w.format == Format::kFp8Block128 ? moe_gemm::kFp8Block : 32;
  if (w.cols <= 0 || w.cols % align != 0)
    return bad("K = " + std::to_string(w.cols) + " must be a positive multiple of " +
               std::to_string(align));
  if (w.rows <= 0 || (silu_mul && w.rows % 2 != 0))
    return bad("a fused gate/up weight needs an even number of rows");
  const int64_t out_cols = silu_mul ? w.rows / 2 : w.rows;
  if (out_cols % 2 != 0) return bad("the output width must be even");
  if (x_stride % 8 != 0 || x_stride < w.cols) return bad("x_stride must be >= K and % 8 == 0");
  if (y_stride % 2 != 0 || y_stride < out_cols)
    return bad("y_stride must be >= the output width and even");
  if (w.format == Format::kFp8Block128 && w.block_scales == nullptr) return bad("no block scales");
  if (w.format == Format::kNvfp4 && (w.group_scales == nullptr || w.row_scales == nullptr))
    return bad("no group or row scales");
  return out_cols;
}

// Whether the product runs on native operands, for `rows` rows of x to quantize.
absl::StatusOr<bool> nativeOperands(const ExpertWeights& w, GemmOperands operands,
                                    const void* scratch, int64_t scratch_bytes, int64_t rows,
                                    int tile_rows, const char* op) {
  if (operands == GemmOperands::kWidened || w.format == Format::kBf16) return false;
  const bool forced = operands == GemmOperands::kNative;
  auto refuse = [&](const std::string& why) -> absl::StatusOr<bool> {
    if (!forced) return false;
    return absl::FailedPreconditionError(std::string(op) + " (" + expertWeightFormatName(w.format) +
                                         "): native operands " + why);
  };
  if (w.format == Format::kNvfp4 && !moe_gemm::nativeFp4Available())
    return refuse("need sm_120a kernels, which this device cannot run");
  if (w.format == Format::kNvfp4 && w.cols % 64 != 0) return refuse("need K % 64 == 0");
  if (!moe_gemm::nativeTilesBuilt(tile_rows, computeMajor()))
    return refuse("in 64-row tiles need sm_120 (this device runs 16-row ones)");
  if (rows <= 0) return refuse("need the rows of x to quantize (MoeGemmArgs::tokens)");
  if (!forced && !nativeOperandsPreferred(w.format)) return false;
  if (reinterpret_cast<uintptr_t>(scratch) % 256 != 0)
    return refuse("need 256-byte aligned scratch");
  const int64_t need = nativeScratchBytes(w.format, rows, w.cols);
  if (scratch_bytes < need)
    return refuse("need " + std::to_string(need) + " bytes of scratch, given " +
                  std::to_string(scratch_bytes));
  return true;
}

// Quantizes x into scratch and points the kernel's native inputs at it.
absl::Status quantizeInto(Params& p, Format format, int64_t rows, void* scratch,
                          const int32_t* live_tiles, int tile_rows, cudaStream_t stream) {
  const RowQuantization kind = rowQuantization(format);
  const QuantizedRows q = carveQuantizedRows(kind, rows, p.k, scratch);
  CLEAVE_RETURN_IF_ERROR(quantizeRows({.kind = kind,
                                       .x = p.x,
                                       .x_stride = p.x_stride,
                                       .rows = rows,
                                       .k = p.k,
                                       .out = q,
                                       .live_tiles = live_tiles,
                                       .tile_rows = tile_rows},
                                      stream));
  p.xq = q.codes;
  p.x_scales = q.scales;
  p.x_group_scales = q.group_scales;
  return absl::OkStatus();
}

Params params(const ExpertWeights& w, const void* x, int64_t x_stride, int64_t out_cols, void* y,
              int64_t y_stride) {
  Params p;
  p.x = static_cast<const bf16*>(x);
  p.x_stride = x_stride;
  p.w = w.data;
  p.block_scales = w.block_scales;
  p.group_scales = w.group_scales;
  p.row_scales = w.row_scales;
  p.rows = w.rows;
  p.out_cols = out_cols;
  p.half = out_cols;
  p.k = w.cols;
  p.y = static_cast<bf16*>(y);
  p.y_stride = y_stride;
  return p;
}

void launchRows(const Params& p, int tile_rows, Format format, bool native, bool silu,
                int64_t tiles, cudaStream_t stream) {
  using moe_gemm::launchShape;
  switch (format) {
    case Format::kBf16: launchShape<Format::kBf16, false>(p, tile_rows, silu, tiles, stream); break;
    case Format::kFp8Block128:
      if (native) {
        launchShape<Format::kFp8Block128, true>(p, tile_rows, silu, tiles, stream);
      } else {
        launchShape<Format::kFp8Block128, false>(p, tile_rows, silu, tiles, stream);
      }
      break;
    case Format::kNvfp4:
      if (native) {
        moe_gemm::launchNativeFp4(p, tile_rows, silu, tiles, stream);
      } else {
        launchShape<Format::kNvfp4, false>(p, tile_rows, silu, tiles, stream);
      }
      break;
  }
}

}  // namespace

absl::Status runMoeGemm(const MoeGemmArgs& a, cudaStream_t stream) {
  if (a.plan == nullptr) return absl::InvalidArgumentError("moe_gemm: no layout plan");
  CLEAVE_ASSIGN_OR_RETURN(
      const int64_t out_cols,
      checkProduct(a.weights, a.x, a.x_stride, a.silu_mul, a.y, a.y_stride, "moe_gemm"));
  if (a.weights.experts != a.plan->experts)
    return absl::InvalidArgumentError("moe_gemm: the weights' experts differ from the layout's");
  if (a.plan->max_tiles > 65535) return absl::InvalidArgumentError("moe_gemm: over 65535 tiles");
  Params p = params(a.weights, a.x, a.x_stride, out_cols, a.y, a.y_stride);
  p.row_pair = a.layout.row_pair;
  p.tile_expert = a.layout.tile_expert;
  p.tile_count = a.layout.tile_count;
  p.slots = a.plan->k;
  p.gather = a.gather;
  p.bias = static_cast<const bf16*>(a.bias);
  p.swiglu_limit = a.activation.limit;
  p.swiglu_alpha = a.activation.alpha;
  const int64_t x_rows = a.gather ? a.tokens : a.plan->max_rows;
  CLEAVE_ASSIGN_OR_RETURN(const bool native,
                          nativeOperands(a.weights, a.operands, a.scratch, a.scratch_bytes, x_rows,
                                         a.plan->tile_rows, "moe_gemm"));
  if (native) {
    if (a.gather && a.tokens > a.plan->max_tokens)
      return absl::InvalidArgumentError("moe_gemm: more tokens than the layout was planned for");
    CLEAVE_RETURN_IF_ERROR(quantizeInto(p, a.weights.format, x_rows, a.scratch,
                                        a.gather ? nullptr : a.layout.tile_count, a.plan->tile_rows,
                                        stream));
  }
  launchRows(p, a.plan->tile_rows, a.weights.format, native, a.silu_mul, a.plan->max_tiles, stream);
  return launchStatus("moe_gemm");
}

absl::Status runSkinnyGemm(const SkinnyGemmArgs& a, cudaStream_t stream) {
  CLEAVE_ASSIGN_OR_RETURN(
      const int64_t out_cols,
      checkProduct(a.weights, a.x, a.x_stride, a.silu_mul, a.y, a.y_stride, "skinny_gemm"));
  if (a.weights.experts != 1)
    return absl::InvalidArgumentError("skinny_gemm: the weights must be one matrix");
  if (a.rows <= 0) return absl::OkStatus();
  const int tile_rows = a.rows <= 16 ? 16 : 64;
  const int64_t tiles = (a.rows + tile_rows - 1) / tile_rows;
  if (tiles > 65535) return absl::InvalidArgumentError("skinny_gemm: over 65535 row tiles");
  Params p = params(a.weights, a.x, a.x_stride, out_cols, a.y, a.y_stride);
  p.dense_rows = a.rows;
  p.bias = static_cast<const bf16*>(a.bias);
  CLEAVE_ASSIGN_OR_RETURN(const bool native,
                          nativeOperands(a.weights, a.operands, a.scratch, a.scratch_bytes, a.rows,
                                         tile_rows, "skinny_gemm"));
  if (native)
    CLEAVE_RETURN_IF_ERROR(
        quantizeInto(p, a.weights.format, a.rows, a.scratch, nullptr, 0, stream));
  launchRows(p, tile_rows, a.weights.format, native, a.silu_mul, tiles, stream);
  return launchStatus("skinny_gemm");
}

}  // namespace cleave::cuda
