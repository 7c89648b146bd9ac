// How a refusal of a prompt past the model's context begins, worded as OpenAI's and vLLM's:
// clients match it to trim a conversation, and the HTTP API gives such a refusal OpenAI's
// code "context_length_exceeded".
#pragma once

namespace cleave::router {

inline constexpr char kContextOverflow[] = "This model's maximum context length is ";

}  // namespace cleave::router
