// Runs a Llama-family model on the CPU for one sequence: prefill a prompt (any number of
// tokens in one call) and decode token by token, with the sequence's keys and values kept
// in a contiguous per-layer cache sized for `max_context` tokens.
//
// Threading: one thread drives a runner; the kernels spread work over `pool`.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/thread_pool.h"
#include "services/engine/llama_weights.h"

namespace cleave::engine {

class LlamaRunner {
 public:
  LlamaRunner(const LlamaWeights& weights, cpu::ThreadPool& pool, int64_t max_context);

  // Appends `tokens` to the sequence and returns the logits [vocab] after its last token.
  // Errors: an empty span, a token id out of the vocabulary, or the context overflowing.
  absl::StatusOr<std::span<const float>> forward(std::span<const uint32_t> tokens);

  // Tokens in the sequence so far.
  int64_t position() const { return position_; }
  void reset() { position_ = 0; }

 private:
  void ensureScratch(int64_t tokens);

  const LlamaWeights& w_;
  cpu::ThreadPool& pool_;
  cpu::Rope rope_;
  int64_t max_context_;
  int64_t position_ = 0;
  // Per layer: [max_context, kv_heads * head_dim].
  std::vector<std::vector<float>> k_cache_;
  std::vector<std::vector<float>> v_cache_;
  // Scratch, [tokens, width] each.
  std::vector<float> x_, h_, q_, k_, v_, attn_, gate_, up_, logits_;
  std::vector<int32_t> positions_;
};

}  // namespace cleave::engine
