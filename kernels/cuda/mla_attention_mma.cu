#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mla_attention_mma.h"
#include "kernels/cuda/paged_tile.cuh"

namespace cleave::cuda::mla {
namespace {

constexpr int kLora = kMmaLora;
constexpr int kRow = kMmaLora + kMmaRope;  // Elements of a cached latent row.
constexpr int kTile = kMmaTile;
constexpr int kHeads = kMmaHeads;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kColumns = kLora / kWarps;  // Value columns each warp accumulates.
static_assert(kTile == 8 * kWarps, "each warp scores 8 positions of a stage");
static_assert(kRow % 32 == 0 && kColumns % 16 == 0);

// Shared memory: the block's query tile [kHeads][kRow] bf16, two pipeline stages of latent
// rows, and a stage's scores (each warp's C fragment as it holds it: [warp][lane] float4). The
// stages hold, for a bf16 cache, [stage][kTile][kRow] bf16; for an e4m3 one, [stage][kTile][kRow]
// staged bytes and one widened [kTile][kRow] bf16 tile — the same bytes.
constexpr int kQBytes = kHeads * kRow * 2;
constexpr int kStageBytes = 2 * kTile * kRow * 2;
constexpr int kScoreBytes = kHeads * kTile * 4;
constexpr int kSharedBytes = kQBytes + kStageBytes + kScoreBytes;
static_assert(kSharedBytes <= 99 * 1024, "sm_120 gives a block at most 99 KiB");

struct Params {
  MlaAttentionArgs a;
  int partitions = 1, block_shift = 0;
  float scale_log2 = 0;          // Of the scores, in exp2 units (e4m3: times the cache scale).
  float value_scale = 1;         // e4m3: the cache scale; bf16: 1.
  float* partial_out = nullptr;  // [tokens][partitions][heads][kLora]
  float* partial_lse = nullptr;  // [tokens][partitions][heads], log2 units
};

// Two stages of kTile latent rows (the cache has one head: kv_heads 1).
template <bool kFp8>
struct LatentStages {
  unsigned char* area;
  const void* cache;
  const int32_t* table;
  int block_shift;

  // Starts copying positions [first, first + kTile) (zero past `end`) into `stage`.
  __device__ __forceinline__ void load(int stage, int first, int end) const {
    if constexpr (kFp8) {
      loadPagedTileFp8<kRow, kTile, kThreads>(area + stage * kTile * kRow,
                                              static_cast<const uint8_t*>(cache), table,
                                              block_shift, 1, 0, first, end);
    } else {
      loadPagedTile<kRow, kTile, kThreads>(reinterpret_cast<bf16*>(area) + stage * kTile * kRow,
                                           static_cast<const bf16*>(cache), table, block_shift, 1,
                                           0, first, end);
    }
  }
  // The bf16 tile of `stage`, once its copies landed (every thread calls it).
  __device__ __forceinline__ const bf16* ready(int stage) const {
    if constexpr (kFp8) {
      bf16* widened = reinterpret_cast<bf16*>(area + 2 * kTile * kRow);
      widenFp8Tile<kRow, kTile, kThreads>(widened, area + stage * kTile * kRow);
      __syncthreads();
      return widened;
    } else {
      return reinterpret_cast<const bf16*>(area) + stage * kTile * kRow;
    }
  }
};

// grid (head groups of kHeads, partitions, tokens), kThreads threads. A stage: each warp
// scores 8 of its positions for all kHeads heads (QKᵀ over the whole row), the scores meet
// in shared memory, then every warp runs the same online softmax over the stage and
// accumulates P·V for its own kColumns of the value (the row's first kLora elements). Each
// latent row is read once for the kHeads heads.
template <bool kFp8>
__global__ void __launch_bounds__(kThreads) mlaMmaAttentionKernel(const Params p) {
  extern __shared__ __align__(128) unsigned char shared[];
  bf16* q_tile = reinterpret_cast<bf16*>(shared);
  unsigned char* area = shared + kQBytes;
  float4* scores = reinterpret_cast<float4*>(shared + kQBytes + kStageBytes);

  const MlaAttentionArgs& a = p.a;
  const int64_t token = blockIdx.z;
  const int head0 = blockIdx.x * kHeads;
  const int rows = min(kHeads, a.heads - head0);
  const int context = a.positions[token] + 1;
  const int part_size = contextPartSize<kTile>(context, p.partitions);
  const int start = blockIdx.y * part_size;
  if (start >= context) return;  // The merge counts only the parts a context reaches.
  const int end = min(context, start + part_size);
  int seq = 0;
  while (seq + 1 < a.sequences && a.q_starts[seq + 1] <= token) ++seq;
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;

  const LatentStages<kFp8> stages{area, a.cache, table, p.block_shift};
  loadRowTile<kRow, kHeads, kThreads>(
      q_tile, a.q + token * a.q_stride + static_cast<int64_t>(head0) * kRow, kRow, rows);
  stages.load(0, start, end);
  cpAsyncCommit();

  float acc[kColumns / 8][4] = {};
  OnlineSoftmax softmax;
  int stage = 0;
  for (int first = start; first < end; first += kTile, stage ^= 1) {
    cpAsyncWait<0>();
    __syncthreads();  // This stage landed; everyone is done with the other and the scores.
    const bf16* tile = stages.ready(stage);
    if (first + kTile < end) stages.load(stage ^ 1, first + kTile, end);
    cpAsyncCommit();

    // This warp's 8 positions: two k-steps per ldmatrix of the latent rows.
    float s[4] = {};
    const int key_row = warp * 8 + (lane & 7);
#pragma unroll 3
    for (int kk = 0; kk < kRow / 16; kk += 2) {
      uint32_t b[4], q0[4], q1[4];
      ldmatrixX4(b, tile + swizzled<kRow>(key_row, 2 * kk + (lane >> 3)));
      ldmatrixX4(q0, q_tile + swizzled<kRow>(lane & 15, 2 * kk + (lane >> 4)));
      ldmatrixX4(q1, q_tile + swizzled<kRow>(lane & 15, 2 * kk + 2 + (lane >> 4)));
      mmaBf16(s, q0, b[0], b[1]);
      mmaBf16(s, q1, b[2], b[3]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int column = warp * 8 + 2 * t + (e & 1);
      s[e] = first + column < end ? s[e] * p.scale_log2 : -INFINITY;
    }
    scores[warp * 32 + lane] = make_float4(s[0], s[1], s[2], s[3]);
    __syncthreads();

    // The whole stage's scores: warp n's fragment is n-tile n, the same in every warp.
    float stage_s[kTile / 8][4];
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
      const float4 v = scores[n * 32 + lane];
      stage_s[n][0] = v.x, stage_s[n][1] = v.y, stage_s[n][2] = v.z, stage_s[n][3] = v.w;
    }
    float rescale[2];
    softmax.update<kTile / 8>(stage_s, rescale);
    rescaleRows<kColumns / 8>(acc, rescale);
#pragma unroll
    for (int j = 0; j < kTile / 16; ++j) {
      uint32_t prob[4];
      probabilityFragment<kTile / 8>(stage_s, j, prob);
      const int value_row = 16 * j + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
      for (int n2 = 0; n2 < kColumns / 16; ++n2) {
        uint32_t b[4];
        ldmatrixX4Trans(
            b, tile + swizzled<kRow>(value_row, warp * (kColumns / 8) + 2 * n2 + (lane >> 4)));
        mmaBf16(acc[2 * n2], prob, b[0], b[1]);
        mmaBf16(acc[2 * n2 + 1], prob, b[2], b[3]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    if (row >= rows) continue;
    const int head = head0 + row;
    const float norm = p.value_scale / softmax.sum[r];
    if (p.partitions == 1) {
      bf16* out =
          a.out + token * a.out_stride + static_cast<int64_t>(head) * kLora + warp * kColumns;
#pragma unroll
      for (int n = 0; n < kColumns / 8; ++n)
        *reinterpret_cast<uint32_t*>(out + 8 * n + 2 * t) =
            packBf16(acc[n][2 * r] * norm, acc[n][2 * r + 1] * norm);
    } else {
      const int64_t slot = (token * p.partitions + blockIdx.y) * a.heads + head;
      float* out = p.partial_out + slot * kLora + warp * kColumns;
#pragma unroll
      for (int n = 0; n < kColumns / 8; ++n)
        *reinterpret_cast<float2*>(out + 8 * n + 2 * t) =
            make_float2(acc[n][2 * r] * norm, acc[n][2 * r + 1] * norm);
      if (warp == 0 && t == 0) p.partial_lse[slot] = softmax.max[r] + __log2f(softmax.sum[r]);
    }
  }
}

// grid (heads, tokens), kThreads threads over the value columns: merges a token's parts.
__global__ void __launch_bounds__(kThreads) mlaMergeKernel(const Params p) {
  const MlaAttentionArgs& a = p.a;
  const int head = blockIdx.x;
  const int64_t token = blockIdx.y;
  const int context = a.positions[token] + 1;
  const int part_size = contextPartSize<kTile>(context, p.partitions);
  const int used = (context + part_size - 1) / part_size;
  const int64_t base = token * p.partitions * a.heads + head;
  float top = -INFINITY;
  for (int i = 0; i < used; ++i) top = fmaxf(top, p.partial_lse[base + i * a.heads]);
  for (int c = threadIdx.x; c < kLora; c += kThreads) {
    float sum = 0.0f, value = 0.0f;
    for (int i = 0; i < used; ++i) {
      const float weight = exp2f(p.partial_lse[base + i * a.heads] - top);
      sum += weight;
      value += weight * p.partial_out[(base + i * a.heads) * kLora + c];
    }
    a.out[token * a.out_stride + static_cast<int64_t>(head) * kLora + c] =
        __float2bfloat16(value / sum);
  }
}

}  // namespace

absl::Status allowMmaSharedMemory() {
  for (const void* kernel : {reinterpret_cast<const void*>(mlaMmaAttentionKernel<false>),
                             reinterpret_cast<const void*>(mlaMmaAttentionKernel<true>)}) {
    CLEAVE_RETURN_IF_ERROR(cudaStatus(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
        "mla_attention shared memory"));
  }
  return absl::OkStatus();
}

absl::Status launchMma(const MlaAttentionArgs& a, int partitions, cudaStream_t stream) {
  const bool fp8 = a.kv_dtype == KvDtype::kFp8E4M3;
  Params p{.a = a,
           .partitions = partitions,
           .block_shift = __builtin_ctz(static_cast<unsigned>(a.block_size)),
           .scale_log2 = a.scale * (fp8 ? a.kv_scale : 1.0f) * kLog2e,
           .value_scale = fp8 ? a.kv_scale : 1.0f};
  if (partitions > 1) {
    p.partial_out = static_cast<float*>(a.workspace);
    p.partial_lse = p.partial_out + a.tokens * partitions * a.heads * kLora;
  }
  const dim3 grid((a.heads + kHeads - 1) / kHeads, partitions, static_cast<unsigned>(a.tokens));
  if (fp8)
    mlaMmaAttentionKernel<true><<<grid, kThreads, kSharedBytes, stream>>>(p);
  else
    mlaMmaAttentionKernel<false><<<grid, kThreads, kSharedBytes, stream>>>(p);
  CLEAVE_RETURN_IF_ERROR(launchStatus("mla_attention"));
  if (partitions == 1) return absl::OkStatus();
  mlaMergeKernel<<<dim3(a.heads, static_cast<unsigned>(a.tokens)), kThreads, 0, stream>>>(p);
  return launchStatus("mla_attention merge");
}

}  // namespace cleave::cuda::mla
