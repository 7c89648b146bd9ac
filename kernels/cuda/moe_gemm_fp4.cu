// The expert-GEMM kernels on sm_120a's block-scaled E2M1 MMA (W4A4), built for sm_120a
// only: on any other device their image is missing and nativeFp4Available() says so.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe_gemm_kernel.cuh"

// Built for any other target, mmaNvfp4 would compile to a trap that loads and runs; this
// file's kernels must hold the real instruction.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM120_ALL)
#error "moe_gemm_fp4.cu is built for sm_120a only (its block-scaled E2M1 MMA)"
#endif

namespace cleave::cuda::moe_gemm {

bool nativeFp4Available() {
  static std::array<std::atomic<int>, 64> known{};
  return onceForDevice(known, [](int) {
           cudaFuncAttributes attributes;
           const cudaError_t error =
               cudaFuncGetAttributes(&attributes, moeGemmKernel<1, Format::kNvfp4, false, true>);
           if (error != cudaSuccess) (void)cudaGetLastError();  // No image here: not sticky.
           return error == cudaSuccess ? 1 : 0;
         }) == 1;
}

absl::Status allowNativeFp4() { return allowAll<Format::kNvfp4, true>(); }

void launchNativeFp4(const Params& p, int tile_rows, bool silu, int64_t tiles,
                     cudaStream_t stream) {
  launchShape<Format::kNvfp4, true>(p, tile_rows, silu, tiles, stream);
}

}  // namespace cleave::cuda::moe_gemm
