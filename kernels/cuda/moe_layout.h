// Token permutation for the grouped expert GEMM: from each token's k routed experts to rows
// grouped by expert, each expert's run padded to a whole number of GEMM tiles.
//
// A "pair" is (token, slot), index token * k + slot of the router's [tokens][k] output.
// Expert e owns rows [expert_rows[e], expert_rows[e + 1]); its pairs come first (in no
// particular order: every row of a product is computed on its own, so the order changes
// no value), then padding rows (row_pair = -1) up to a multiple of `tile_rows`. Tile t
// covers rows [t * tile_rows, (t + 1) * tile_rows) of expert tile_expert[t]; *tile_count
// tiles are in use. An expert id outside [0, experts) (another rank's expert under expert
// parallelism) gets no row: its pair_row is -1 and combine skips it.
//
// Sizes are fixed at plan time for the most tokens a step can have, so a CUDA graph can
// capture the build and the GEMMs whose grids cover max_tiles (unused tiles exit at once).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace cleave::cuda {

struct MoeLayoutPlan {
  int64_t max_tokens = 0;
  int k = 0;
  int experts = 0;    // this rank's, <= 1024 (may be fewer than k)
  int tile_rows = 0;  // 16 (decode-size tiles) or 64 (prefill-size)
  int64_t max_rows = 0;
  int64_t max_tiles = 0;
  size_t workspace_bytes = 0;  // for the layout's int32 arrays, 256-byte aligned each
};

absl::StatusOr<MoeLayoutPlan> planMoeLayout(int64_t max_tokens, int k, int experts, int tile_rows);

// Device arrays inside one workspace of plan.workspace_bytes.
struct MoeLayout {
  int32_t* expert_rows = nullptr;  // [experts + 1]
  int32_t* row_pair = nullptr;     // [max_rows]
  int32_t* pair_row = nullptr;     // [max_tokens * k]
  int32_t* tile_expert = nullptr;  // [max_tiles]
  int32_t* tile_count = nullptr;   // [1]
};

MoeLayout carveMoeLayout(const MoeLayoutPlan& plan, void* workspace);

// Builds the layout of `tokens` (<= plan.max_tokens) tokens' expert ids ([tokens][k]); this
// rank holds experts [expert_begin, expert_begin + plan.experts) (expert parallelism), the
// layout's expert e being id expert_begin + e.
absl::Status buildMoeLayout(const MoeLayoutPlan& plan, const int32_t* expert_ids, int64_t tokens,
                            const MoeLayout& layout, cudaStream_t stream, int expert_begin = 0);

// out[t][h] = sum over slots s with a row of weights[t][s] * y[pair_row[t * k + s]][h]
//             (+ shared[t][h]), accumulated in f32 in slot order.
struct MoeCombineArgs {
  const void* y = nullptr;  // bf16 [rows][hidden], the down projection's permuted rows
  int64_t y_stride = 0;
  const float* weights = nullptr;  // [tokens][k]
  const int32_t* pair_row = nullptr;
  int64_t tokens = 0;
  int k = 0;
  int hidden = 0;                // even
  const void* shared = nullptr;  // bf16 [tokens][hidden] or null: the shared experts' output
  int64_t shared_stride = 0;
  void* out = nullptr;  // bf16 [tokens][hidden]
  int64_t out_stride = 0;
};

absl::Status combineExperts(const MoeCombineArgs& args, cudaStream_t stream);

}  // namespace cleave::cuda
