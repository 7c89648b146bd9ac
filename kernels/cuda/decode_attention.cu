#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention_variants.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/paged_tile.cuh"

namespace cleave::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = kWarps * 16;  // KV positions per pipeline stage, 16 per warp

struct DecodeParams {
  DecodeAttentionArgs args;
  int heads, kv_heads, block_shift, q_tiles, partitions;
  int window;          // 0: every position
  ScoreScale score;    // raw score to exp2 units
  float* partial_out;  // [batch][partitions][heads][D]
  float* partial_lse;  // [batch][partitions][heads], log2 units
};

template <int D, bool kFp8>
using Stages = KvStages<D, kValueColumns<D>, kTile, kThreads, kFp8>;

// Heads over 128 values keep the query tile where stage 1 goes (until its first load), so
// that a head of 256's stages fit sm_120's 99 KB.
template <int D>
inline constexpr bool kQueryInStage = D > 128;

// The first position a sequence of `len` attends to: its window's.
__device__ __forceinline__ int firstAttended(int len, int window) {
  return window > 0 ? max(0, len - window) : 0;
}

template <int D, bool kFp8>
constexpr int decodeSharedBytes() {
  constexpr int q_tile = kQueryInStage<D> ? 0 : 16 * D * static_cast<int>(sizeof(bf16));
  return q_tile + Stages<D, kFp8>::kBytes;  // Q tile, stages
}

// grid (partitions, kv_heads * q_tiles * value parts, batch), kThreads threads. Each warp
// owns 16 of a stage's 64 positions with its own online softmax; the warps merge at the
// end. A head of 256 has two value parts: each block accumulates 128 of its output values.
template <int D, bool kFp8>
__global__ void __launch_bounds__(kThreads) decodeAttentionKernel(const DecodeParams p) {
  constexpr int DV = kValueColumns<D>;
  extern __shared__ __align__(128) unsigned char shared[];
  unsigned char* area = kQueryInStage<D> ? shared : shared + 16 * D * sizeof(bf16);
  bf16* q_tile = reinterpret_cast<bf16*>(
      kQueryInStage<D> ? area + Stages<D, kFp8>::kSecondStageOffset : shared);
  const int value_part = blockIdx.y % kValueParts<D>;
  const int tile_index = blockIdx.y / kValueParts<D>;  // kv head * q_tiles + q tile
  const int col0 = value_part * DV;

  const DecodeAttentionArgs& a = p.args;
  const int seq = blockIdx.z;
  const int len = a.seq_lens[seq];
  const int lo = firstAttended(len, p.window);
  const int partition_size = contextPartSize<kTile>(len - lo, p.partitions);
  const int start = lo + blockIdx.x * partition_size;
  if (start >= len) {
    // An empty sequence (outside the contract) still gets a defined output: zeros.
    if (len <= 0 && blockIdx.x == 0 && p.partitions == 1) {
      const int group = p.heads / p.kv_heads;
      const int head0 = (tile_index / p.q_tiles) * group + (tile_index % p.q_tiles) * 16;
      const int rows = min(16, group - (tile_index % p.q_tiles) * 16);
      for (int i = threadIdx.x; i < rows * DV; i += kThreads)
        a.out[seq * a.out_stride + static_cast<int64_t>(head0 + i / DV) * D + col0 + i % DV] =
            __float2bfloat16(0.0f);
    }
    return;
  }
  const int end = min(len, start + partition_size);
  const int group = p.heads / p.kv_heads;
  const int kv_head = tile_index / p.q_tiles;
  const int head0 = kv_head * group + (tile_index % p.q_tiles) * 16;
  const int rows = min(16, group - (tile_index % p.q_tiles) * 16);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;

  const Stages<D, kFp8> stages{area,          a.k_cache,  a.v_cache, table,
                               p.block_shift, p.kv_heads, kv_head,   col0};
  // The group's query heads of this token are consecutive rows of D elements.
  loadRowTile<D, 16, kThreads>(q_tile, a.q + seq * a.q_stride + static_cast<int64_t>(head0) * D, D,
                               rows);
  stages.load(0, start, end);
  cpAsyncCommit();

  uint32_t q[D / 16][4];
  float acc[DV / 8][4] = {};
  OnlineSoftmax softmax;
  const int t = lane % 4;
  int stage = 0;
  for (int first = start; first < end; first += kTile, stage ^= 1) {
    cpAsyncWait<0>();
    __syncthreads();  // This stage landed; everyone is done with the other one.
    if (first == start) {
      loadQFragments<D>(q, q_tile, 0, lane);
      // Every warp has its fragments before stage 1's copies overwrite the tile.
      if constexpr (kQueryInStage<D>) __syncthreads();
    }
    const bf16* k = stages.ready(stage);
    if (first + kTile < end) stages.load(stage ^ 1, first + kTile, end);
    cpAsyncCommit();

    float s[2][4] = {};
    accumulateQK<D>(s, q, k, warp * 16, lane);
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int pos = first + warp * 16 + n * 8 + 2 * t + (e & 1);
        s[n][e] = pos < end ? scaledScore(s[n][e], p.score) : -INFINITY;
      }
    float rescale[2];
    softmax.update<2>(s, rescale);
    rescaleRows<DV / 8>(acc, rescale);
    uint32_t prob[4];
    probabilityFragment<2>(s, 0, prob);
    accumulatePV<DV>(acc, prob, k + kTile * D, warp * 16, lane);
  }

  // Merge the warps: their accumulators and (max, sum) pairs go through shared memory,
  // reusing the stages.
  cpAsyncWait<0>();
  __syncthreads();
  float* partial = reinterpret_cast<float*>(area);  // [warp][16 rows][DV]
  float* stats = partial + kWarps * 16 * DV;        // [warp][16 rows][max, sum]
  const int g = lane / 4;
#pragma unroll
  for (int n = 0; n < DV / 8; ++n) {
    float* row_g = partial + (warp * 16 + g) * DV + n * 8 + 2 * t;
    row_g[0] = acc[n][0];
    row_g[1] = acc[n][1];
    row_g[8 * DV] = acc[n][2];
    row_g[8 * DV + 1] = acc[n][3];
  }
  if (t == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      stats[(warp * 16 + g + 8 * r) * 2] = softmax.max[r];
      stats[(warp * 16 + g + 8 * r) * 2 + 1] = softmax.sum[r];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * DV; i += kThreads) {
    const int row = i / DV;
    const int d = col0 + i % DV;  // the output column
    float top = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, stats[(w * 16 + row) * 2]);
    float sum = 0.0f, value = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = exp2f(stats[(w * 16 + row) * 2] - top);
      sum += weight * stats[(w * 16 + row) * 2 + 1];
      value += weight * partial[(w * 16 + row) * DV + d - col0];
    }
    const int head = head0 + row;
    if (p.partitions == 1) {
      a.out[seq * a.out_stride + static_cast<int64_t>(head) * D + d] =
          __float2bfloat16(normalized(value * a.v_scale, sum, top, a.sinks, head));
    } else {
      const int64_t slot = (static_cast<int64_t>(seq) * p.partitions + blockIdx.x) * p.heads + head;
      p.partial_out[slot * D + d] = value * a.v_scale / sum;
      if (d == 0) p.partial_lse[slot] = top + __log2f(sum);
    }
  }
}

// grid (heads, batch), D threads: merges a sequence's partitions.
template <int D>
__global__ void __launch_bounds__(D) mergePartitionsKernel(const DecodeParams p) {
  const DecodeAttentionArgs& a = p.args;
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int len = max(a.seq_lens[seq], 0);
  const int span = len - firstAttended(len, p.window);
  const int partition_size = contextPartSize<kTile>(span, p.partitions);
  const int used = (span + partition_size - 1) / partition_size;
  if (used == 0) {  // An empty sequence: zeros, not 0 / 0.
    a.out[seq * a.out_stride + static_cast<int64_t>(head) * D + threadIdx.x] =
        __float2bfloat16(0.0f);
    return;
  }
  const int64_t base = static_cast<int64_t>(seq) * p.partitions * p.heads + head;
  float top = -INFINITY;
  for (int i = 0; i < used; ++i) top = fmaxf(top, p.partial_lse[base + i * p.heads]);
  float sum = 0.0f, value = 0.0f;
  for (int i = 0; i < used; ++i) {
    const float weight = exp2f(p.partial_lse[base + i * p.heads] - top);
    sum += weight;
    value += weight * p.partial_out[(base + i * p.heads) * D + threadIdx.x];
  }
  a.out[seq * a.out_stride + static_cast<int64_t>(head) * D + threadIdx.x] =
      __float2bfloat16(normalized(value, sum, top, a.sinks, head));
}

template <int D, bool kFp8>
absl::Status launch(const DecodeAttentionPlan& plan, const DecodeParams& params,
                    cudaStream_t stream) {
  const dim3 grid(plan.partitions, plan.shape.kv_heads * plan.q_tiles * kValueParts<D>,
                  params.args.batch);
  decodeAttentionKernel<D, kFp8><<<grid, kThreads, decodeSharedBytes<D, kFp8>(), stream>>>(params);
  if (absl::Status s = launchStatus("decode_attention"); !s.ok()) return s;
  if (plan.partitions == 1) return absl::OkStatus();
  mergePartitionsKernel<D><<<dim3(plan.shape.heads, params.args.batch), D, 0, stream>>>(params);
  return launchStatus("decode_attention merge");
}

template <int D, bool kFp8>
absl::Status allowSharedMemory() {
  return cudaStatus(cudaFuncSetAttribute(decodeAttentionKernel<D, kFp8>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         decodeSharedBytes<D, kFp8>()),
                    "decode_attention shared memory");
}

}  // namespace

absl::StatusOr<DecodeAttentionPlan> planDecodeAttention(const DecodeAttentionShape& shape,
                                                        int multiprocessors) {
  if (absl::Status s =
          checkHeadsAndPages("decode attention", shape.heads, shape.kv_heads, shape.block_size);
      !s.ok())
    return s;
  if (shape.max_batch < 1 || shape.max_context < 1)
    return absl::InvalidArgumentError("decode attention: max_batch and max_context must be >= 1");
  if (shape.window < 0) return absl::InvalidArgumentError("decode attention: window must be >= 0");
  if (!(shape.softcap >= 0))
    return absl::InvalidArgumentError("decode attention: softcap must be >= 0 (0: none)");
  DecodeAttentionPlan plan{.shape = shape};
  const int group = shape.heads / shape.kv_heads;
  plan.q_tiles = (group + 15) / 16;
  // Split the context until the largest batch gives about four blocks per SM, keeping at
  // least four stages of work in every partition.
  const int value_parts = shape.head_dim > 128 ? 2 : 1;  // kValueParts
  const int blocks = shape.max_batch * shape.kv_heads * plan.q_tiles * value_parts;
  const int wanted = std::max(1, (4 * multiprocessors + blocks - 1) / blocks);
  // A sliding window bounds the positions a sequence reads, however long it is.
  const int reach =
      shape.window > 0 ? std::min(shape.max_context, shape.window) : shape.max_context;
  const int longest = (reach + kTile - 1) / kTile * kTile;
  int size = (longest + wanted - 1) / wanted;
  size = std::max(4 * kTile, (size + kTile - 1) / kTile * kTile);
  plan.partition_size = std::min(size, longest);
  plan.partitions = (reach + plan.partition_size - 1) / plan.partition_size;
  if (plan.partitions > 1) {
    const size_t slots = static_cast<size_t>(shape.max_batch) * plan.partitions * shape.heads;
    plan.workspace_bytes = slots * (shape.head_dim + 1) * sizeof(float);
  }
  absl::Status allowed = withAttentionVariant(
      shape.head_dim, shape.kv_dtype, "decode attention",
      [](auto d, auto f) { return allowSharedMemory<decltype(d)::value, decltype(f)::value>(); });
  if (!allowed.ok()) return allowed;
  return plan;
}

absl::Status runDecodeAttention(const DecodeAttentionPlan& plan, const DecodeAttentionArgs& args,
                                cudaStream_t stream) {
  if (args.batch < 1 || args.batch > plan.shape.max_batch)
    return absl::InvalidArgumentError(absl::StrCat("decode attention: batch ", args.batch,
                                                   " outside [1, ", plan.shape.max_batch, "]"));
  if (plan.partitions > 1 && args.workspace == nullptr)
    return absl::InvalidArgumentError("decode attention: the plan needs a workspace");
  if (absl::Status aligned =
          checkAlignment("decode attention", args.q, args.q_stride, args.k_cache, args.v_cache);
      !aligned.ok())
    return aligned;
  DecodeParams params{.args = args,
                      .heads = plan.shape.heads,
                      .kv_heads = plan.shape.kv_heads,
                      .block_shift = __builtin_ctz(static_cast<unsigned>(plan.shape.block_size)),
                      .q_tiles = plan.q_tiles,
                      .partitions = plan.partitions,
                      .window = plan.shape.window,
                      .score = scoreScale(plan.shape.scale, args.k_scale, plan.shape.softcap)};
  if (plan.partitions > 1) {
    params.partial_out = static_cast<float*>(args.workspace);
    params.partial_lse = params.partial_out + static_cast<size_t>(plan.shape.max_batch) *
                                                  plan.partitions * plan.shape.heads *
                                                  plan.shape.head_dim;
  }
  return withAttentionVariant(
      plan.shape.head_dim, plan.shape.kv_dtype, "decode attention", [&](auto d, auto f) {
        return launch<decltype(d)::value, decltype(f)::value>(plan, params, stream);
      });
}

}  // namespace cleave::cuda
