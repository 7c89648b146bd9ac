#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mla_attention.h"
#include "kernels/cuda/mla_attention_mma.h"
#include "kernels/cuda/rope_device.cuh"

namespace cleave::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 64;  // Positions scored, softmaxed and accumulated together.

// The max (kMax) or sum of every thread's `v`; `red` holds kWarps floats. Every thread gets
// the result, and `red` may be reused after.
template <bool kMax>
__device__ __forceinline__ float blockReduce(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kWarps; ++w) r = kMax ? fmaxf(r, red[w]) : r + red[w];
  __syncthreads();
  return r;
}

// One block per (token, head). Each chunk of positions: a warp per position scores it
// (lanes over the latent), then the chunk's softmax weights rescale and extend the
// accumulated latent (threads over its elements).
template <bool kFp8>
__global__ void __launch_bounds__(kThreads) mlaAttentionKernel(const MlaAttentionArgs a) {
  extern __shared__ float smem[];
  __shared__ float red[kWarps];
  __shared__ int64_t rows_at[kChunk];
  const int row = a.kv_lora + a.rope;
  float* q = smem;             // [row]
  float* acc = q + row;        // [kv_lora]
  float* p = acc + a.kv_lora;  // [kChunk]
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int seq = 0;
  while (seq + 1 < a.sequences && a.q_starts[seq + 1] <= t) ++seq;
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  const int context = a.positions[t] + 1;
  const bf16* q_row = a.q + t * a.q_stride + static_cast<int64_t>(h) * row;
  for (int d = threadIdx.x; d < row; d += kThreads) q[d] = __bfloat162float(q_row[d]);
  for (int d = threadIdx.x; d < a.kv_lora; d += kThreads) acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  __syncthreads();
  for (int begin = 0; begin < context; begin += kChunk) {
    const int n = min(kChunk, context - begin);
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const int position = begin + j;
      rows_at[j] = (static_cast<int64_t>(table[position / a.block_size]) * a.block_size +
                    position % a.block_size) *
                   row;
    }
    __syncthreads();
    for (int j = warp; j < n; j += kWarps) {
      float s = 0.0f;
      for (int d = lane; d < row; d += 32)
        s += q[d] * loadKv<kFp8>(a.cache, rows_at[j] + d, a.kv_scale);
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) p[j] = s * a.scale;
    }
    __syncthreads();
    float chunk_max = -INFINITY;
    for (int j = threadIdx.x; j < n; j += kThreads) chunk_max = fmaxf(chunk_max, p[j]);
    chunk_max = blockReduce<true>(chunk_max, red);
    const float m_new = fmaxf(m, chunk_max);
    const float factor = __expf(m - m_new);  // 0 before the first chunk
    float sum = 0.0f;
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const float e = __expf(p[j] - m_new);
      p[j] = e;
      sum += e;
    }
    sum = blockReduce<false>(sum, red);  // Its barrier also publishes p.
    l = l * factor + sum;
    for (int d = threadIdx.x; d < a.kv_lora; d += kThreads) {
      float v = acc[d] * factor;
      for (int j = 0; j < n; ++j) v += p[j] * loadKv<kFp8>(a.cache, rows_at[j] + d, a.kv_scale);
      acc[d] = v;
    }
    m = m_new;
    __syncthreads();
  }
  bf16* out = a.out + t * a.out_stride + static_cast<int64_t>(h) * a.kv_lora;
  const float inv = 1.0f / l;
  for (int d = threadIdx.x; d < a.kv_lora; d += kThreads) out[d] = __float2bfloat16(acc[d] * inv);
}

// The CUDA-core kernel's shared memory: the query row, the accumulated latent, a chunk's
// weights.
size_t cudaCoreSharedBytes(int kv_lora, int rope) {
  return sizeof(float) * (2 * static_cast<size_t>(kv_lora) + rope + kChunk);
}

// Blocks of the tensor-core kernel per token and context part.
int64_t headGroups(int heads) { return (heads + mla::kMmaHeads - 1) / mla::kMmaHeads; }

// Every latent size, one block per (token, head).
absl::Status launchCudaCores(const MlaAttentionArgs& args, cudaStream_t stream) {
  const size_t smem = cudaCoreSharedBytes(args.kv_lora, args.rope);
  const dim3 grid(static_cast<unsigned>(args.tokens), static_cast<unsigned>(args.heads));
  if (args.kv_dtype == KvDtype::kFp8E4M3)
    mlaAttentionKernel<true><<<grid, kThreads, smem, stream>>>(args);
  else
    mlaAttentionKernel<false><<<grid, kThreads, smem, stream>>>(args);
  return launchStatus("mla_attention");
}

}  // namespace

absl::StatusOr<MlaAttentionPlan> planMlaAttention(const MlaAttentionShape& shape,
                                                  int multiprocessors) {
  if (shape.kv_lora < 1 || shape.rope < 0 || shape.heads < 1 || shape.max_tokens < 1 ||
      shape.max_context < 1)
    return absl::InvalidArgumentError(
        "mla_attention: heads, kv_lora, max_tokens and max_context must be positive, rope >= 0");
  if (shape.max_tokens > 65535)  // A grid dimension per token.
    return absl::InvalidArgumentError(absl::StrCat("mla_attention: max_tokens ", shape.max_tokens,
                                                   " is above 65535; lower the step's tokens"));
  CLEAVE_RETURN_IF_ERROR(checkHeadsAndPages("mla_attention", shape.heads, 1, shape.block_size));
  MlaAttentionPlan plan{.shape = shape, .multiprocessors = std::max(1, multiprocessors)};
  plan.tensor_cores = shape.kv_lora == mla::kMmaLora && shape.rope == mla::kMmaRope;
  if (!plan.tensor_cores) {
    // 48 KiB per block without opting in, the kernel's static arrays included.
    constexpr size_t kStatic = sizeof(float) * kWarps + sizeof(int64_t) * kChunk;
    if (cudaCoreSharedBytes(shape.kv_lora, shape.rope) + kStatic > 48 * 1024)
      return absl::InvalidArgumentError(absl::StrCat(
          "mla_attention: a latent row of ", shape.kv_lora, " + ", shape.rope,
          " elements is too long for the CUDA-core kernel (the tensor-core one takes 512 + 64)"));
    return plan;
  }
  CLEAVE_RETURN_IF_ERROR(mla::allowMmaSharedMemory());
  // Enough parts of the context that a single token gives about four blocks per SM, each
  // part a few stages long; the workspace holds twice what a call of few tokens needs.
  const int64_t groups = headGroups(shape.heads);
  const int wanted = static_cast<int>((4 * plan.multiprocessors + groups - 1) / groups);
  plan.max_partitions =
      std::max(1, std::min(wanted, (shape.max_context + mla::kMmaMinPart - 1) / mla::kMmaMinPart));
  if (plan.max_partitions > 1) {
    plan.partial_tokens = std::min(shape.max_tokens * plan.max_partitions, 2 * wanted);
    plan.workspace_bytes = static_cast<size_t>(plan.partial_tokens) * shape.heads *
                           (shape.kv_lora + 1) * sizeof(float);
  }
  return plan;
}

absl::Status mlaAttention(const MlaAttentionPlan& plan, const MlaAttentionArgs& args,
                          cudaStream_t stream) {
  const MlaAttentionShape& shape = plan.shape;
  if (args.heads != shape.heads || args.kv_lora != shape.kv_lora || args.rope != shape.rope ||
      args.block_size != shape.block_size || args.kv_dtype != shape.kv_dtype)
    return absl::InvalidArgumentError(
        "mla_attention: heads, latent sizes, block_size or cache type differ from the plan's");
  if (args.tokens > shape.max_tokens)
    return absl::InvalidArgumentError(
        absl::StrCat("mla_attention: ", args.tokens, " tokens, the plan takes ", shape.max_tokens));
  if (args.tokens == 0) return absl::OkStatus();
  if (args.sequences < 1 || args.max_blocks_per_seq < 1)
    return absl::InvalidArgumentError(
        "mla_attention: sequences and max_blocks_per_seq must be positive");
  if (!plan.tensor_cores) return launchCudaCores(args, stream);
  CLEAVE_RETURN_IF_ERROR(
      checkAlignment("mla_attention", args.q, args.q_stride, args.cache, args.cache));
  if (args.out_stride % 2 != 0 || reinterpret_cast<uintptr_t>(args.out) % 4 != 0)
    return absl::InvalidArgumentError("mla_attention: out and out_stride must be 4-byte aligned");
  // Parts of each context: as many as keep the GPU busy, within the workspace (the kernel
  // sizes them per token, so a short context is not spread thin).
  const int64_t groups = headGroups(shape.heads);
  int64_t parts = (4 * plan.multiprocessors + args.tokens * groups - 1) / (args.tokens * groups);
  parts = std::min<int64_t>({parts, plan.max_partitions, plan.partial_tokens / args.tokens});
  parts = std::max<int64_t>(parts, 1);
  if (parts > 1 && args.workspace == nullptr)
    return absl::InvalidArgumentError("mla_attention: the plan needs a workspace");
  return mla::launchMma(args, static_cast<int>(parts), stream);
}

}  // namespace cleave::cuda
