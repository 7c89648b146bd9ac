// Gated DeltaNet linear attention (model::LinearAttentionConfig, Qwen3.5) on the CPU: one
// layer over a step's token rows, each sequence's convolution inputs and recurrent state kept
// in its slot of the KvStorage's state area rather than in KV blocks.
//
// A rank holds a run of key heads with the value heads that read them (ShardDims
// linear_key_heads, linear_value_heads): its share of every projection but the output one,
// whose product is a partial sum to all-reduce, and its heads' state.
//
// One layer's state of one sequence, this rank's key heads one after another, key head g's:
//   conv   [conv_kernel - 1][2·key_head_dim + r·value_head_dim]   the last inputs of its
//          query, key and its r = value_heads / key_heads value heads' channels to the
//          convolution, oldest first
//   S      [r][key_head_dim][value_head_dim]
// (gatedDeltaNetGroupFloats each), so any run of key heads is one run of floats: what a
// transfer between workers of different TP layouts moves, as it moves KV heads. A chunk
// starting at position 0 starts from zeros; a later chunk continues from the state the
// previous chunk of its sequence left, so chunks of one sequence must run in order.
//
// Threading: one rank thread calls forward(); the work spreads over the pool.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/model/model_config.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "services/engine/tensor_parallel.h"

namespace cleave::engine {

// One layer's weights, this rank's share (kd: its key heads · key_head_dim; vd: its value
// heads · value_head_dim).
struct GatedDeltaNetWeights {
  cpu::CpuMatrix q, k;  // [kd, hidden] each: in_proj_qkv's query and key rows
  cpu::CpuMatrix v;     // [vd, hidden]: its value rows
  cpu::CpuMatrix z;     // [vd, hidden]: the output gate
  cpu::CpuMatrix b, a;  // [value heads, hidden]: write strength and decay inputs
  // Qwen3-Next (grouped_qkvz, grouped_ba) instead of q, k, v, z (and of b, a): each of the
  // rank's key heads' q, k, its r value heads' v, then z rows ([key heads · (2·key_head_dim +
  // 2r·value_head_dim), hidden]), and their b then a rows ([key heads · 2r, hidden]).
  cpu::CpuMatrix qkvz, ba;
  std::vector<float> conv;     // [channels][conv_kernel], channels = kd, kd, vd in order
  std::vector<float> a_rate;   // [value heads]: −exp(A_log), each head's decay rate
  std::vector<float> dt_bias;  // [value heads]
  std::vector<float> norm;     // [value_head_dim]: the gated RMSNorm's weights
  cpu::CpuMatrix out;          // [hidden, vd]
};

// Floats of one key head's share of one layer's state of one sequence (its group).
int64_t gatedDeltaNetGroupFloats(const model::LinearAttentionConfig& config);
// Floats of one layer's state of one sequence on a rank holding `dims`' heads.
int64_t gatedDeltaNetStateFloats(const model::LinearAttentionConfig& config, const ShardDims& dims);
// Floats of one sequence's state over all of the model's linear-attention layers on that rank
// (0 for a model without them): KvStorageOptions::state_floats. Laid out [linear layer][the
// rank's key heads][group].
int64_t linearStateFloats(const model::ModelConfig& config, const ShardDims& dims);

// One sequence's rows of a step: `tokens` consecutive rows, its layer state at `state`
// (stateFloats floats), zeroed first when `reset` (the chunk starts the sequence).
// after_rows[i], where given and not null: another layer state (of the same size) that
// receives the state after row i as well (SequenceChunk::row_states).
struct LinearStateRun {
  int64_t tokens = 0;
  bool reset = false;
  float* state = nullptr;
  std::span<float* const> after_rows;
};

class GatedDeltaNet {
 public:
  GatedDeltaNet(const model::ModelConfig& config, const ShardDims& dims, cpu::ThreadPool& pool);

  // The layer's output for the step's rows: x [rows, hidden] (normed), runs covering the rows
  // in order; writes out [rows, hidden] (this rank's partial sum) and advances each run's
  // state. x and out may not overlap.
  void forward(const GatedDeltaNetWeights& w, const float* x, std::span<const LinearStateRun> runs,
               float* out);

 private:
  void ensureScratch(int64_t rows);
  // Convolution and SiLU of one run's rows of mixed_ (channels wide) in place, from and into
  // the conv rows of its layer state (and of after_rows' after each row).
  void convolve(const GatedDeltaNetWeights& w, float* rows, const LinearStateRun& run);
  // Where channel `ch` of mixed_ keeps its inputs in a layer state: its group's conv rows,
  // at this offset from the group's start (one row of group_channels_ per input).
  int64_t convOffset(int64_t ch) const;
  // Value head h's key head, and its place among that key head's value heads
  // (LinearAttentionConfig::tiled_value_heads says how they are ordered).
  int64_t keyHeadOf(int64_t h) const;
  int64_t indexInGroup(int64_t h) const;
  // The delta rule over one run's rows (from mixed_ row `row`) for value head `h`, whose S
  // is at `offset` in a layer state: o_ rows of that head.
  void recur(const GatedDeltaNetWeights& w, int64_t row, const LinearStateRun& run, int64_t h,
             int64_t offset);

  const model::LinearAttentionConfig& c_;
  const int64_t hidden_;
  const float eps_;
  const int64_t key_heads_, value_heads_;  // This rank's.
  const int64_t kd_, vd_, channels_;
  const int64_t group_channels_, group_floats_;  // Of one key head's group.
  cpu::ThreadPool& pool_;
  // Scratch: mixed_ [rows, channels] (q, k, v), z_ and o_ [rows, vd], b_ and a_ [rows,
  // value heads]; grouped_ and ba_ the grouped projections' products.
  std::vector<float> mixed_, z_, o_, b_, a_, grouped_, ba_;
  // The grouped products' rows spread into mixed_ and z_ (qkvz), b_ and a_ (ba).
  void ungroup(int64_t rows, bool qkvz, bool ba);
};

}  // namespace cleave::engine
