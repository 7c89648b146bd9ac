// The worker protocol's request messages as engine requests, and engine outcomes as
// protocol values.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "cleave/v1/worker.pb.h"
#include "services/engine/scheduler.h"

namespace cleave::worker {

struct RequestParts {
  const google::protobuf::RepeatedField<uint32_t>* prompt = nullptr;
  const v1::SamplingParams* sampling = nullptr;
  const v1::StoppingCriteria* stopping = nullptr;
  std::optional<uint32_t> logprobs;
  uint32_t output_tokens = 0;  // generated tokens at the end of the prompt (a moved sequence)
};

// The parts of a PrefillRequest or StartDecodeRequest.
template <typename Message>
RequestParts partsOf(const Message& m) {
  RequestParts parts{
      .prompt = &m.prompt_token_ids(), .sampling = &m.sampling(), .stopping = &m.stopping()};
  if (m.has_logprobs()) parts.logprobs = m.logprobs();
  parts.output_tokens = m.output_tokens();
  return parts;
}

// The engine request `id` for `parts`. `eos` are the model's end-of-sequence ids (dropped
// when stopping.ignore_eos); an unset max_new_tokens means the rest of `context_length`.
// InvalidArgument naming the field ("sampling.top_p") for values the engine refuses;
// Unimplemented for stopping.min_new_tokens.
absl::StatusOr<engine::GenerationRequest> toEngineRequest(uint64_t id, const RequestParts& parts,
                                                          const std::vector<uint32_t>& eos,
                                                          int64_t context_length);

v1::FinishReason finishReason(engine::StopReason reason);

// The logprob message of a sampled token, and of a scored prompt token.
v1::TokenLogprob tokenLogprob(const engine::TokenEvent& event);
v1::TokenLogprob tokenLogprob(const engine::SampledToken& scored);

}  // namespace cleave::worker
