// Validation of client requests that needs no model: ranges of sampling and stopping values
// and the shape of the input. Model-dependent checks (token ids against the vocabulary,
// lengths against the context) happen once the model is known.
#pragma once

#include "absl/status/status.h"
#include "cleave/v1/generation.pb.h"

namespace cleave::router {

// Largest number of top alternatives a client may ask for per token.
inline constexpr uint32_t kMaxLogprobs = 20;
// Limits that keep one request from costing the router unbounded work.
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;
inline constexpr size_t kMaxRequestIdBytes = 128;
inline constexpr size_t kMaxJsonSchemaBytes = 1 << 20;
inline constexpr int kMaxLogitBiasEntries = 1024;
inline constexpr int kMaxAllowedTokens = 65536;
// Prompt log-probabilities of one request, alternatives included: (prompt tokens - 1) *
// (prompt_logprobs + 1) at most this (well under a 4 MiB message).
inline constexpr int64_t kMaxPromptLogprobEntries = 32768;

// OK, or InvalidArgument whose message names the field and says what is allowed,
// e.g. "sampling.top_p must be in (0, 1], got 1.5".
absl::Status validateGenerateRequest(const v1::GenerateRequest& request);
// A chat input's messages (non-empty, each with a role), as Generate and Tokenize take it.
absl::Status validateChat(const v1::Chat& chat);

}  // namespace cleave::router
