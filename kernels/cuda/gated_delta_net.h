// Gated DeltaNet linear attention on the GPU (Qwen3.5, Qwen3-Next): the CUDA twin of the
// CPU layer (services/engine/gated_delta_net.h) between its input projection and its output
// projection, which run as ordinary products.
//
// Per layer and step, two kernels:
//   convolution  one thread per (sequence, channel) of q, k, v: the causal depthwise
//                convolution over the sequence's rows with the last conv_kernel − 1 inputs
//                kept in its state, then SiLU, into `mixed` (f32);
//   delta rule   one block per (sequence, value head), the head's state S [d_k][d_v] in
//                registers (thread (j, p) holds column j's rows [32p, 32p + 32)): per row,
//                q and k L2-normed (q also by 1/√d_k), β = σ(b), g = a_rate·softplus(a +
//                dt_bias), S = e^g·S, S += k ⊗ β(v − Sᵀk), o = Sᵀq, then o RMS-normed with
//                `norm` and times SiLU(z), written bf16.
// Each column of S evolves on its own (only the norm joins a head's outputs), so a head's
// columns may be split over `column_groups` blocks: more blocks for a few long sequences
// (a prefill), whose raw outputs a third kernel then norms.
// A sequence whose first row is at position 0 starts from a zero state; its state is
// written back after its last row, so chunks of one sequence run in order, one per step.
// A row may also leave the state after it in another slot (row_slots).
//
// The state of a sequence is one slot of `states`: [linear layer][key head][group], a
// group being conv [conv_kernel − 1][2·d_k + r·d_v] (its q, k and r value heads' channels
// of each kept input, oldest first) then S of its r value heads — the CPU layout, so a
// state moves between CPU and GPU workers as it is.
//
// Every call enqueues on `stream` (capturable: the sequences, positions and slots are read
// on the device) and returns the launch's error.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace cleave::cuda {

struct GatedDeltaNetArgs {
  // The input projection of the step's rows, [tokens][proj_stride], this rank's heads: q
  // [key_heads][d_k], k [key_heads][d_k], v [value_heads][d_v], z [value_heads][d_v],
  // b [value_heads], a [value_heads]. Value head h reads key head h / (value_heads /
  // key_heads).
  const __nv_bfloat16* proj = nullptr;
  int64_t proj_stride = 0;
  float* mixed = nullptr;                // [tokens][2·key_heads·d_k + value_heads·d_v] scratch
  const int32_t* q_starts = nullptr;     // [sequences + 1]: each sequence's rows
  const int32_t* positions = nullptr;    // [tokens]
  const int32_t* state_slots = nullptr;  // [sequences]
  // [tokens], or null for none: the slot that also receives the layer's state after the
  // row (−1: none; ignored for a sequence's last row, whose state is its own), for drafts
  // to be taken back (SequenceChunk::row_states). Not a slot any sequence of the step
  // reads or writes.
  const int32_t* row_slots = nullptr;
  float* states = nullptr;  // slot s at states + s·slot_floats
  int64_t slot_floats = 0;
  int64_t layer_offset = 0;        // this layer's state in a slot, in floats
  const float* conv = nullptr;     // [channels][conv_kernel], channels q, k, v in order
  const float* a_rate = nullptr;   // [value_heads]: −exp(A_log)
  const float* dt_bias = nullptr;  // [value_heads]
  const float* norm = nullptr;     // [d_v]
  int sequences = 0;
  int key_heads = 0, value_heads = 0;
  int key_head_dim = 0, value_head_dim = 0;
  int conv_kernel = 0;
  float eps = 1e-6f;
  __nv_bfloat16* out = nullptr;  // [tokens][out_stride]: value head h at h·d_v
  int64_t out_stride = 0;
  // Blocks a value head's columns are split over, a divisor of value_head_dim. Above 1,
  // `raw` ([tokens][value_heads·d_v] f32 scratch) holds the outputs before the gated norm,
  // and `tokens` must be the step's rows (q_starts[sequences]).
  int column_groups = 1;
  float* raw = nullptr;
  int tokens = 0;
};

// What the kernels take: conv_kernel 2..6, key_head_dim <= 128, value_head_dim <= 256 and,
// for key heads over 32, value_head_dim × (key_head_dim rounded up to 64 or 128) / 32 <= 512
// (Qwen3.5's and Qwen3-Next's heads of 128: 512 threads), value_heads a multiple of
// key_heads. InvalidArgument naming the size otherwise.
absl::Status gatedDeltaNetSupported(int key_head_dim, int value_head_dim, int conv_kernel,
                                    int key_heads, int value_heads);

// Floats of one key head's group of one layer's state (the CPU's gatedDeltaNetGroupFloats).
int64_t gatedDeltaNetGroupFloats(int key_head_dim, int value_head_dim, int conv_kernel, int ratio);

// Column groups for a step of few, long sequences (a prefill): 4, 2 or 1, the most that
// divide value_head_dim within the split blocks' 256 threads.
int gatedDeltaNetColumnGroups(int key_head_dim, int value_head_dim);

absl::Status gatedDeltaNet(const GatedDeltaNetArgs& args, cudaStream_t stream);

}  // namespace cleave::cuda
