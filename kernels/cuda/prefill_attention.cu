#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention_variants.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/paged_tile.cuh"
#include "kernels/cuda/prefill_attention.h"

namespace cleave::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = kWarps * 16;  // query rows per block, 16 per warp
// Key positions per pipeline stage: 64, or 32 for heads over 128 values (whose stages,
// with the query tile, then fit sm_120's 99 KB).
template <int D>
inline constexpr int kKeys = D > 128 ? 32 : 64;
// Heads over 128 values read the queries' fragments from the tile at each k-step rather
// than keeping them in registers.
template <int D>
inline constexpr bool kQueryFromTile = D > 128;

struct PrefillParams {
  PrefillAttentionArgs args;
  int heads, kv_heads, block_shift;
  int window;        // 0: every position up to the query's
  ScoreScale score;  // raw score to exp2 units
};

template <int D, bool kFp8>
using Stages = KvStages<D, kValueColumns<D>, kKeys<D>, kThreads, kFp8>;

template <int D, bool kFp8>
constexpr int prefillSharedBytes() {
  return kRows * D * static_cast<int>(sizeof(bf16)) + Stages<D, kFp8>::kBytes;  // Q, stages
}

// grid (query tiles, heads * value parts, sequences), kThreads threads. The warps share
// every K/V stage and each runs the online softmax of its own 16 query rows. A head of 256
// has two value parts: each block accumulates 128 of its output values.
template <int D, bool kFp8>
// minBlocks = 1: without it ptxas squeezes the head_dim 16 variant into 72 registers and spills.
__global__ void __launch_bounds__(kThreads, 1) prefillAttentionKernel(const PrefillParams p) {
  constexpr int DV = kValueColumns<D>;
  constexpr int kTile = kKeys<D>;
  extern __shared__ __align__(128) unsigned char shared[];
  bf16* q_tile = reinterpret_cast<bf16*>(shared);
  unsigned char* area = shared + kRows * D * sizeof(bf16);

  const PrefillAttentionArgs& a = p.args;
  const int seq = blockIdx.z;
  const int q_begin = a.q_starts[seq];
  const int new_tokens = a.q_starts[seq + 1] - q_begin;
  const int row0 = blockIdx.x * kRows;
  if (row0 >= new_tokens) return;
  const int context = a.context_lens[seq];
  const int first_position = context - new_tokens;  // of the sequence's first new token
  const int head = blockIdx.y / kValueParts<D>;
  const int col0 = (blockIdx.y % kValueParts<D>)*DV;
  const int kv_head = head / (p.heads / p.kv_heads);
  const int rows = min(kRows, new_tokens - row0);
  // Keys past the block's last query position are masked for every row, and with a window
  // those before its first query position's window: never load them.
  const int end = first_position + row0 + rows;
  const int lo = p.window > 0 ? max(0, first_position + row0 - p.window + 1) : 0;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;

  const Stages<D, kFp8> stages{area,          a.k_cache,  a.v_cache, table,
                               p.block_shift, p.kv_heads, kv_head,   col0};
  loadRowTile<D, kRows, kThreads>(
      q_tile, a.q + (q_begin + row0) * a.q_stride + static_cast<int64_t>(head) * D, a.q_stride,
      rows);
  stages.load(0, lo, end);
  cpAsyncCommit();

  const int g = lane / 4;
  const int t = lane % 4;
  // Position of this lane's first query row (the second is 8 rows on).
  const int query_pos = first_position + row0 + warp * 16 + g;
  uint32_t q[kQueryFromTile<D> ? 1 : D / 16][4];
  float acc[DV / 8][4] = {};
  OnlineSoftmax softmax;
  int stage = 0;
  for (int first = lo; first < end; first += kTile, stage ^= 1) {
    cpAsyncWait<0>();
    __syncthreads();
    if constexpr (!kQueryFromTile<D>) {
      if (first == lo) loadQFragments<D>(q, q_tile, warp * 16, lane);
    }
    const bf16* k = stages.ready(stage);
    if (first + kTile < end) stages.load(stage ^ 1, first + kTile, end);
    cpAsyncCommit();

    float s[kTile / 8][4] = {};
#pragma unroll
    for (int j = 0; j < kTile / 16; ++j) {
      float(&pair)[2][4] = *reinterpret_cast<float(*)[2][4]>(&s[2 * j]);
      if constexpr (kQueryFromTile<D>) {
        accumulateQKFromTile<D>(pair, q_tile, warp * 16, k, 16 * j, lane);
      } else {
        accumulateQK<D>(pair, q, k, 16 * j, lane);
      }
    }
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = first + n * 8 + 2 * t + (e & 1);
        const int query = query_pos + 8 * (e >> 1);
        const bool seen = key <= query && key < end && (p.window == 0 || key > query - p.window);
        s[n][e] = seen ? scaledScore(s[n][e], p.score) : -INFINITY;
      }
    float rescale[2];
    softmax.update<kTile / 8>(s, rescale);
    rescaleRows<DV / 8>(acc, rescale);
#pragma unroll
    for (int j = 0; j < kTile / 16; ++j) {
      uint32_t prob[4];
      probabilityFragment<kTile / 8>(s, j, prob);
      accumulatePV<DV>(acc, prob, k + kTile * D, 16 * j, lane);
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + warp * 16 + g + 8 * r;
    if (row >= new_tokens) continue;
    const float inverse = normalized(a.v_scale, softmax.sum[r], softmax.max[r], a.sinks, head);
    bf16* out = a.out + (q_begin + row) * a.out_stride + static_cast<int64_t>(head) * D + col0;
#pragma unroll
    for (int n = 0; n < DV / 8; ++n) {
      *reinterpret_cast<uint32_t*>(out + n * 8 + 2 * t) =
          packBf16(acc[n][2 * r] * inverse, acc[n][2 * r + 1] * inverse);
    }
  }
}

template <int D, bool kFp8>
absl::Status allowSharedMemory() {
  return cudaStatus(cudaFuncSetAttribute(prefillAttentionKernel<D, kFp8>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         prefillSharedBytes<D, kFp8>()),
                    "prefill_attention shared memory");
}

template <int D, bool kFp8>
absl::Status launch(const PrefillAttentionPlan& plan, const PrefillParams& params,
                    cudaStream_t stream) {
  const dim3 grid(plan.query_tiles, plan.shape.heads * kValueParts<D>, params.args.sequences);
  prefillAttentionKernel<D, kFp8>
      <<<grid, kThreads, prefillSharedBytes<D, kFp8>(), stream>>>(params);
  return launchStatus("prefill_attention");
}

}  // namespace

absl::StatusOr<PrefillAttentionPlan> planPrefillAttention(const PrefillAttentionShape& shape) {
  if (absl::Status s =
          checkHeadsAndPages("prefill attention", shape.heads, shape.kv_heads, shape.block_size);
      !s.ok())
    return s;
  if (shape.max_sequences < 1 || shape.max_new_tokens < 1)
    return absl::InvalidArgumentError(
        "prefill attention: max_sequences and max_new_tokens must be >= 1");
  if (shape.window < 0) return absl::InvalidArgumentError("prefill attention: window must be >= 0");
  if (!(shape.softcap >= 0))
    return absl::InvalidArgumentError("prefill attention: softcap must be >= 0 (0: none)");
  absl::Status allowed = withAttentionVariant(
      shape.head_dim, shape.kv_dtype, "prefill attention",
      [](auto d, auto f) { return allowSharedMemory<decltype(d)::value, decltype(f)::value>(); });
  if (!allowed.ok()) return allowed;
  return PrefillAttentionPlan{.shape = shape,
                              .query_tiles = (shape.max_new_tokens + kRows - 1) / kRows};
}

absl::Status runPrefillAttention(const PrefillAttentionPlan& plan, const PrefillAttentionArgs& args,
                                 cudaStream_t stream) {
  if (args.sequences < 1 || args.sequences > plan.shape.max_sequences)
    return absl::InvalidArgumentError(absl::StrCat("prefill attention: sequences ", args.sequences,
                                                   " outside [1, ", plan.shape.max_sequences, "]"));
  if (absl::Status aligned =
          checkAlignment("prefill attention", args.q, args.q_stride, args.k_cache, args.v_cache);
      !aligned.ok())
    return aligned;
  if (args.out_stride % 2 != 0 || reinterpret_cast<uintptr_t>(args.out) % 4 != 0)
    return absl::InvalidArgumentError("prefill attention: out and out_stride must be even");
  const PrefillParams params{
      .args = args,
      .heads = plan.shape.heads,
      .kv_heads = plan.shape.kv_heads,
      .block_shift = __builtin_ctz(static_cast<unsigned>(plan.shape.block_size)),
      .window = plan.shape.window,
      .score = scoreScale(plan.shape.scale, args.k_scale, plan.shape.softcap)};
  return withAttentionVariant(
      plan.shape.head_dim, plan.shape.kv_dtype, "prefill attention", [&](auto d, auto f) {
        return launch<decltype(d)::value, decltype(f)::value>(plan, params, stream);
      });
}

}  // namespace cleave::cuda
