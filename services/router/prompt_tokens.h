// What the router checks of a prompt once it knows the model: the model or LoRA adapter a
// request names, truncation (vLLM's truncate_prompt_tokens), and ids against the
// vocabulary. Generate and Embed take their prompts through the same checks.
//
// Threading: free functions; no shared state.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/router/worker_pool.h"

namespace cleave::router {

// The refusal of a text or chat prompt by a router without a tokenizer.
inline constexpr char kNoPromptTokenizer[] =
    "this router has no tokenizer (start it with --model); send token_ids";

// The adapter `name` runs with: null for the base model (any of its names, or empty);
// NotFound naming what the router serves for a name it does not.
absl::StatusOr<const WorkerPool::AdapterView*> adapterNamed(const WorkerPool::ModelView& model,
                                                            const std::string& name);

// Keeps the last `keep` tokens of `prompt` (keep > 0), or as many as a context of
// `context_length` leaves with room for one new token (keep = -1); keep = 0 keeps it all.
// InvalidArgument for other values.
absl::Status truncatePrompt(int32_t keep, int64_t context_length, std::vector<uint32_t>& prompt);

// InvalidArgument naming the first id outside [0, vocab_size), the field called `field`.
absl::Status checkVocabulary(std::span<const uint32_t> ids, uint32_t vocab_size,
                             const char* field = "token_ids");

}  // namespace cleave::router
