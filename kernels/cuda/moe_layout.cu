#include "kernels/cuda/moe_layout.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace cleave::cuda {
namespace {

constexpr int kMaxExperts = 1024;
constexpr int kLayoutThreads = 1024;  // one thread per expert in the scan

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

struct LayoutParams {
  const int32_t* expert_ids;
  int expert_begin;
  int64_t pairs;
  int experts;
  int tile_rows;
  MoeLayout layout;
};

// One block: count each expert's pairs, scan the padded counts, then place the pairs.
__global__ void __launch_bounds__(kLayoutThreads) buildLayoutKernel(LayoutParams p) {
  using Scan = cub::BlockScan<int, kLayoutThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int count[kMaxExperts];
  __shared__ int cursor[kMaxExperts];
  const int tid = threadIdx.x;
  if (tid < p.experts) count[tid] = 0;
  __syncthreads();
  for (int64_t i = tid; i < p.pairs; i += kLayoutThreads) {
    const int e = p.expert_ids[i] - p.expert_begin;
    if (e >= 0 && e < p.experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  const int mine = tid < p.experts ? count[tid] : 0;
  const int padded = (mine + p.tile_rows - 1) / p.tile_rows * p.tile_rows;
  int offset = 0, total = 0;
  Scan(scan_storage).ExclusiveSum(padded, offset, total);
  if (tid < p.experts) {
    p.layout.expert_rows[tid] = offset;
    cursor[tid] = offset;
    for (int t = 0; t < padded / p.tile_rows; ++t)
      p.layout.tile_expert[offset / p.tile_rows + t] = tid;
    for (int r = offset + mine; r < offset + padded; ++r) p.layout.row_pair[r] = -1;
  }
  if (tid == 0) {
    p.layout.expert_rows[p.experts] = total;
    *p.layout.tile_count = total / p.tile_rows;
  }
  __syncthreads();
  for (int64_t i = tid; i < p.pairs; i += kLayoutThreads) {
    const int e = p.expert_ids[i] - p.expert_begin;
    int row = -1;
    if (e >= 0 && e < p.experts) {
      row = atomicAdd(&cursor[e], 1);
      p.layout.row_pair[row] = static_cast<int32_t>(i);
    }
    p.layout.pair_row[i] = row;
  }
}

// One block per token; each thread sums two adjacent features over the token's slots.
__global__ void combineKernel(MoeCombineArgs a) {
  const int64_t token = blockIdx.x;
  const auto* y = static_cast<const __nv_bfloat162*>(a.y);
  for (int h = 2 * threadIdx.x; h < a.hidden; h += 2 * blockDim.x) {
    float2 sum = make_float2(0.0f, 0.0f);
    for (int s = 0; s < a.k; ++s) {
      const int32_t row = a.pair_row[token * a.k + s];
      if (row < 0) continue;
      const float w = a.weights[token * a.k + s];
      const float2 v = __bfloat1622float2(y[(row * a.y_stride + h) / 2]);
      sum.x += w * v.x;
      sum.y += w * v.y;
    }
    if (a.shared != nullptr) {
      const float2 v = __bfloat1622float2(
          static_cast<const __nv_bfloat162*>(a.shared)[(token * a.shared_stride + h) / 2]);
      sum.x += v.x;
      sum.y += v.y;
    }
    static_cast<__nv_bfloat162*>(a.out)[(token * a.out_stride + h) / 2] =
        __floats2bfloat162_rn(sum.x, sum.y);
  }
}

}  // namespace

absl::StatusOr<MoeLayoutPlan> planMoeLayout(int64_t max_tokens, int k, int experts, int tile_rows) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("moe layout: " + what);
  };
  if (experts < 1 || experts > kMaxExperts) return bad("experts must be in [1, 1024]");
  // k counts all experts' slots (the router's); a rank may hold fewer experts than k.
  if (k < 1 || k > 1024) return bad("k must be in [1, 1024]");
  if (tile_rows != 16 && tile_rows != 64) return bad("tile_rows must be 16 or 64");
  if (max_tokens < 1 || max_tokens * k > (int64_t{1} << 30)) return bad("max_tokens out of range");
  MoeLayoutPlan plan{.max_tokens = max_tokens, .k = k, .experts = experts, .tile_rows = tile_rows};
  const int64_t pairs = max_tokens * k;
  // Every used expert adds at most tile_rows - 1 padding rows.
  plan.max_rows = pairs + std::min<int64_t>(experts, pairs) * (tile_rows - 1);
  plan.max_rows = (plan.max_rows + tile_rows - 1) / tile_rows * tile_rows;
  plan.max_tiles = plan.max_rows / tile_rows;
  plan.workspace_bytes = aligned(4 * (experts + 1)) + aligned(4 * plan.max_rows) +
                         aligned(4 * pairs) + aligned(4 * plan.max_tiles) + aligned(4);
  return plan;
}

MoeLayout carveMoeLayout(const MoeLayoutPlan& plan, void* workspace) {
  auto* p = static_cast<unsigned char*>(workspace);
  auto take = [&p](size_t count) {
    auto* out = reinterpret_cast<int32_t*>(p);
    p += aligned(4 * count);
    return out;
  };
  MoeLayout layout;
  layout.expert_rows = take(plan.experts + 1);
  layout.row_pair = take(plan.max_rows);
  layout.pair_row = take(plan.max_tokens * plan.k);
  layout.tile_expert = take(plan.max_tiles);
  layout.tile_count = take(1);
  return layout;
}

absl::Status buildMoeLayout(const MoeLayoutPlan& plan, const int32_t* expert_ids, int64_t tokens,
                            const MoeLayout& layout, cudaStream_t stream, int expert_begin) {
  if (tokens < 0 || tokens > plan.max_tokens) {
    return absl::InvalidArgumentError("moe layout: " + std::to_string(tokens) +
                                      " tokens, planned for at most " +
                                      std::to_string(plan.max_tokens));
  }
  buildLayoutKernel<<<1, kLayoutThreads, 0, stream>>>(
      {expert_ids, expert_begin, tokens * plan.k, plan.experts, plan.tile_rows, layout});
  return launchStatus("moe layout");
}

absl::Status combineExperts(const MoeCombineArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return absl::OkStatus();
  if (a.hidden < 2 || a.hidden % 2 != 0 || a.y_stride % 2 != 0 || a.out_stride % 2 != 0 ||
      (a.shared != nullptr && a.shared_stride % 2 != 0)) {
    return absl::InvalidArgumentError("moe combine: hidden and strides must be even");
  }
  const int threads = std::min(256, (a.hidden / 2 + 31) / 32 * 32);
  combineKernel<<<static_cast<unsigned>(a.tokens), threads, 0, stream>>>(a);
  return launchStatus("moe combine");
}

}  // namespace cleave::cuda
