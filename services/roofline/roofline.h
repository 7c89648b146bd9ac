// The physical floor of a forward step (../../docs/roofline.md, ARCHITECTURE §7): the
// larger of the bytes it must read over memory bandwidth and its FLOPs over the peak, plus
// the time of its tensor-parallel collectives. `cleave roofline` prints it term by term;
// workers compute it for every step they run and export measured time next to it.
//
// Per rank, a step reads the weights it touches in their stored format — for an MoE layer
// the expected number of distinct experts a batch of B tokens routes to,
// E x (1 - (1 - k/E)^B), not k, and the router whole (every rank holds and runs it) — plus
// every attended position's KV; it computes
// 2 x parameters touched x tokens plus attention (2 x positions x heads x (qk + v dims)
// per layer, each token over every position it attends); its activations pass through
// memory once per layer (the residual stream read and written in 16 bits); and it
// all-reduces twice per layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"

namespace cleave::roofline {

// What one rank (one GPU, or this CPU) can do.
struct Hardware {
  std::string name;
  double bandwidth = 0;   // Memory, bytes/s.
  double peak_flops = 0;  // For the weights' products, FLOP/s.
  // For the products of weights kept in float where peak_flops is a quantized format's (the
  // int8 kernels' on CPUs), FLOP/s; 0: peak_flops. Which products those are is the
  // workload's (Workload::float_products).
  double float_peak_flops = 0;
  double attention_flops = 0;  // For attention (bf16 on GPUs, f32 on CPUs), FLOP/s.
  double link_bandwidth = 0;   // Between ranks, one way, bytes/s (0: one rank only).
  double link_latency = 0;     // Of one small all-reduce, s.
};

// The built-in GPU profiles (../../../shared/PERF.md); `dtype` ("bf16", "fp8", "fp4")
// picks the product peak. NotFound lists the names.
absl::StatusOr<Hardware> builtinHardware(const std::string& name, const std::string& dtype);
std::vector<std::string> builtinHardwareNames();

struct Workload {
  int tp = 1;
  int64_t sequences = 1;     // In the step.
  int64_t new_tokens = 1;    // Tokens computed (decode: one per sequence).
  int64_t attended = 0;      // Positions attended, summed over the new tokens (FLOPs).
  int64_t kv_positions = 0;  // Distinct positions whose KV the step reads (bytes).
  // The same two in the model's sliding-window layers (ModelConfig::sliding_window), which
  // see only a token's last positions; unused when the model has none.
  int64_t windowed_attended = 0;
  int64_t windowed_kv_positions = 0;
  double bytes_per_weight = 2;  // Stored format (0.5625 for NVFP4 with scales, ...).
  // When > 0, the weight bytes a rank holds, known exactly (a loaded model), instead of
  // parameters x bytes_per_weight; of them routed_expert_bytes are a MoE model's routed
  // experts, of which a step reads the share its tokens are expected to choose.
  double weight_bytes = 0;
  double routed_expert_bytes = 0;
  double bytes_per_kv = 2;  // Per KV element.
  // Of each kind of product, the share of parameters whose weights are float, multiplied at
  // Hardware::float_peak_flops, in a model quantized in part (gpt-oss: MXFP4 experts, bf16
  // attention and head; an NVFP4 MLP whose down projection is not whole blocks). MoE
  // routers always are.
  struct FloatProducts {
    double attention = 0;  // Q, K, V, O (and MLA's projections).
    double mlp = 0;        // Dense layers' MLPs and shared experts.
    double experts = 0;    // Routed experts.
    double lm_head = 0;
  };
  FloatProducts float_products;
};

// What `tokens` new tokens after `start` cached ones of a sequence attend (positions summed
// over the tokens: FLOPs) and read (distinct positions: bytes) in a layer that sees each
// token's last `window` positions (0: all of them).
struct AttentionSpan {
  int64_t attended = 0;
  int64_t kv_positions = 0;
};
AttentionSpan attentionSpan(int64_t start, int64_t tokens, int64_t window);

// A decode step of `sequences` sequences with `context` positions each (`window`: the
// model's sliding window, 0 for none).
Workload decodeStep(int64_t sequences, int64_t context, int64_t window = 0);
// A prefill chunk of `tokens` new tokens after `context` cached ones.
Workload prefillChunk(int64_t tokens, int64_t context, int64_t window = 0);

struct Terms {
  double weight_bytes = 0;  // Per rank.
  double kv_bytes = 0;      // And linear-attention state, read and written.
  double activation_bytes = 0;
  double linear_flops = 0;
  double attention_flops = 0;
  double expected_experts = 0;  // Per MoE layer, over all ranks.
  double memory_seconds = 0;
  double compute_seconds = 0;
  double collective_seconds = 0;
  double floor_seconds = 0;  // max(memory, compute) + collectives.
};

// Distinct experts a batch of `tokens` tokens, each routed to k of E, touches on average.
double expectedDistinctExperts(int64_t experts, int64_t k, int64_t tokens);

absl::StatusOr<Terms> stepFloor(const model::ModelConfig& config, const Hardware& hardware,
                                const Workload& workload);

// The terms as a table, with tokens/s at the floor.
std::string formatTerms(const Terms& terms, const Workload& workload);

}  // namespace cleave::roofline
