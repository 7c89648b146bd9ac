// How a model is cut across the ranks of a tensor-parallel group (ARCHITECTURE §1):
//
//   Q/K/V, gate/up   column-parallel: each rank holds a contiguous run of KV heads (with
//                    their query heads) and of MLP columns; with MLA a run of query
//                    heads, and every rank the whole latent projection and cache
//   O, down          row-parallel: the matching input columns; each rank's product is a
//                    partial sum, all-reduced
//   embedding        vocab-parallel: a rank looks up the ids in its vocabulary range and
//                    writes zeros for the others; all-reduced
//   lm-head          vocab-parallel: each rank's logits for its range, all-gathered
//   linear attention like Q/K/V and O: a run of key heads with their value heads (and
//                    those channels of the convolution, the gate z, b and a), each rank's
//                    recurrent state for its heads
//   MoE              experts split across ranks (each rank runs the tokens routed to its
//                    experts: expert parallelism, the default), or every expert's
//                    intermediate columns split like the dense MLP (MoeSplit::kColumns:
//                    every rank runs every routed token, on its columns); the shared
//                    experts split like the dense MLP; all-reduced
//
// Splits need not be even (SmolLM2's 3 KV heads go 2 + 1 over two ranks) but every rank
// gets at least one unit of every split dimension.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"

namespace cleave::engine {

enum class MoeSplit { kExperts, kColumns };

struct TpShard {
  int rank = 0;
  int size = 1;
  MoeSplit moe_split = MoeSplit::kExperts;
  // False when another backend (a GPU's) makes its own copy of the weights and runs the
  // model: the loaded matrices are then kept as stored (cpu::CpuMatrix::asStored), neither
  // rewritten nor packed for the CPU kernels.
  bool cpu_kernels = true;
};

// A contiguous run [begin, begin + size).
struct Span {
  int64_t begin = 0;
  int64_t size = 0;
};

// The part of each split dimension one rank holds.
struct ShardDims {
  TpShard shard;
  Span kv_heads;
  Span heads;       // Query heads: the KV heads' groups.
  Span ffn;         // Dense MLP intermediate columns.
  Span shared_ffn;  // The MoE shared experts' intermediate columns (all experts together).
  Span vocab;       // Embedding and lm-head rows.
  Span experts;     // Routed experts.
  Span expert_ffn;  // Each routed expert's intermediate columns.
  // Linear attention's key heads, and the value heads that read them (model_config.h
  // LinearAttentionConfig).
  Span linear_key_heads;
  Span linear_value_heads;
};

// Rank `index` of `parts` takes its share of `total` elements in whole `unit`s, the first
// (total / unit) % parts ranks one unit more. InvalidArgument naming `what` when `total`
// is not whole units or some rank would get none.
absl::StatusOr<Span> splitEvenly(int64_t total, int64_t unit, int parts, int index,
                                 const char* what);

// "experts" or "columns" (the --moe-split flag); InvalidArgument naming the flag otherwise.
absl::StatusOr<MoeSplit> parseMoeSplit(absl::string_view text);

// The slices of `config` rank `shard.rank` of `shard.size` holds. Errors name the
// dimension that cannot be split that many ways.
absl::StatusOr<ShardDims> planShard(const model::ModelConfig& config, TpShard shard);

}  // namespace cleave::engine
