// Drawing the next token of each row on the GPU, the sampler's truncations in the same
// order as the CPU's (services/engine/sampler.h): temperature 0 is greedy (argmax);
// otherwise softmax(logits / temperature), keep the top_k, then the smallest set whose
// probability reaches top_p, then drop tokens below min_p x the top probability, and draw.
// Ties at a truncation boundary are all kept.
//
// Row r draws with a generator keyed by (seed, index): the same key gives the same token.
// The generator is not the CPU sampler's, so the GPU's draws are its own. Penalties
// (repetition, presence, frequency) are applied to the logits before (applyPenalties).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace cleave::cuda {

struct SamplingRow {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  uint64_t seed = 0;
  uint64_t index = 0;  // which draw of the sequence (its output token count)
};

// A token a sequence has seen: `count` times in its output (0: only in its prompt).
struct SeenToken {
  int32_t token = 0;
  int32_t count = 0;
};

// The sampler's penalties of one row, over its seen tokens seen[begin, begin + size) (each
// token at most once).
struct PenaltyRow {
  float repetition = 1.0f;  // > 0; 1: off
  float presence = 0.0f;
  float frequency = 0.0f;
  int32_t begin = 0;
  int32_t size = 0;
};

// In place, for each row r < rows of logits [rows][vocab] (row stride `stride`) and each
// seen token t of its penalties[r] (device memory, as `seen`), in the CPU sampler's order and
// float arithmetic: x = logits[r][t]; a repetition penalty divides a positive x by it and
// multiplies a negative one; then x -= presence + frequency x count for a token in the
// output. Tokens outside [0, vocab) are skipped.
absl::Status applyPenalties(float* logits, int64_t stride, int64_t rows, int64_t vocab,
                            const PenaltyRow* penalties, const SeenToken* seen,
                            cudaStream_t stream);

// A token and its log-probability.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// For each row r < rows whose counts[r] >= 0 (device memory, like the rest): chosen[r] =
// the log-softmax of logits[r] at ids[r], and top[r][0, counts[r]) the counts[r] largest
// logits' tokens and log-softmax, best first, ties to the lower token (counts[r] <=
// max_top, top's row stride; token -1 past the row's non-NaN logits). Sums in float over the
// vocabulary.
absl::Status logSoftmaxAt(const float* logits, int64_t stride, int64_t rows, int64_t vocab,
                          const int32_t* counts, const int32_t* ids, float* chosen,
                          TokenLogprob* top, int64_t max_top, cudaStream_t stream);

// ids[r] for rows r < rows of logits [rows][vocab] (row stride `stride`); `params` is
// device memory, one SamplingRow per row.
absl::Status sampleTokens(const float* logits, int64_t stride, int64_t rows, int64_t vocab,
                          const SamplingRow* params, int32_t* ids, cudaStream_t stream);

}  // namespace cleave::cuda
