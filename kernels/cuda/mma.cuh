// Device building blocks for tensor-core kernels on sm_90 and sm_120: warp-level
// mma.sync (bf16, e4m3, and sm_120a's block-scaled E2M1), ldmatrix, cp.async and bf16
// packing. Only instructions both architectures share (no wgmma, no tcgen05), so the same
// kernels run on Hopper and on Blackwell workstation parts; the E2M1 product is the one
// exception (sm_120a), used only where its kernels were built for the device.
//
// Fragment layouts of mma.m16n8k16 (bf16 in, f32 accumulate), for lane l, g = l / 4,
// t = l % 4 (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
//   A 16x16 row-major  a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B 16x8  (k x n)    b0 (k 2t..2t+1, n g)              b1 (k 2t+8.., n g)
//   C 16x8  f32        c0 c1 (g, 2t..2t+1)               c2 c3 (g+8, 2t..2t+1)
// The C fragments of two adjacent n-tiles are exactly an A fragment of the next product
// (flash-attention's P·V trick): a0 = C0[0..1], a1 = C0[2..3], a2 = C1[0..1], a3 = C1[2..3].
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace cleave::cuda {

__device__ __forceinline__ uint32_t sharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices from shared memory; lanes 8i..8i+7 give the row addresses of
// matrix i, and register i of every lane receives matrix i's (l / 4, 2 (l % 4)..) pair.
__device__ __forceinline__ void ldmatrixX4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sharedAddress(row))
               : "memory");
}

// The same with every matrix transposed: register i holds (rows 2 (l % 4)..+1, col l / 4).
__device__ __forceinline__ void ldmatrixX4Trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sharedAddress(row))
               : "memory");
}

// c += a · b on the tensor cores (m16n8k16, bf16 operands, f32 accumulators).
__device__ __forceinline__ void mmaBf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a · b with e4m3 operands (m16n8k32, f32 accumulators): native QMMA on sm_120, emulated
// on sm_90. Its fragments hold the bytes the m16n8k16 bf16 fragments hold (four e4m3 values
// where two bf16 were), so an e4m3 tile of [rows][2 D] bytes loads with the ldmatrix
// addressing of a bf16 [rows][D] tile.
__device__ __forceinline__ void mmaE4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += (a x its scales) · (b x its scales) with E2M1 operands and e4m3 scales per 16 elements
// of K (m16n8k64, kind::mxf4nvf4, scale_vec::4X): sm_120a only (elsewhere it traps). The
// fragments again hold the bytes of the bf16 m16n8k16 ones (eight codes where two bf16
// were). sfa: the four scales (K order, first in the low byte) of row g when t is even, of
// row g + 8 when t is odd; sfb: the four scales of column g.
__device__ __forceinline__ void mmaNvfp4(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1, uint32_t sfa, uint32_t sfb) {
#if defined(__CUDA_ARCH_FEAT_SM120_ALL)
  const uint16_t zero = 0;  // byte and thread selectors: all four bytes, the layout above
  asm volatile(
      "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1."
      "f32.ue4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, %10, {%11, %12}, "
      "%13, {%14, %15};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(sfa), "h"(zero),
        "h"(zero), "r"(sfb), "h"(zero), "h"(zero));
#else
  (void)c, (void)a, (void)b0, (void)b1, (void)sfa, (void)sfb;
  __trap();
#endif
}

// Copies 16 bytes global -> shared without passing through registers; when `valid` is
// false nothing is read and the 16 bytes are zero-filled.
__device__ __forceinline__ void cpAsync16(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sharedAddress(shared)),
               "l"(global), "r"(valid ? 16 : 0)
               : "memory");
}
// The same for 4 bytes (through L1).
__device__ __forceinline__ void cpAsync4(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sharedAddress(shared)),
               "l"(global), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most `Pending` committed groups of this thread are still in flight.
template <int Pending>
__device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// Two floats as one register of bf16 (lo in the low half), rounded to nearest.
__device__ __forceinline__ uint32_t packBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Max and sum across the four lanes of a quad (the lanes holding one row of a C fragment).
__device__ __forceinline__ float quadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace cleave::cuda
