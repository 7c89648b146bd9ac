// The OpenAI embeddings API (POST /v1/embeddings), as vLLM serves it for decoder models:
// each input's embedding is the model's last hidden state at its last token, normalized
// (Generation.Embed). Parsing a request into one Embed call per input, and rendering the
// answers as OpenAI's list of embeddings (floats, or base64 of little-endian float32).
//
// Threading: free functions; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cleave/v1/generation.pb.h"
#include "nlohmann/json.hpp"

namespace cleave::router::openai {

// The most inputs one request may carry (OpenAI's limit).
inline constexpr int kMaxEmbeddingInputs = 2048;

struct EmbeddingsCall {
  std::vector<v1::EmbedRequest> inputs;  // In order; each names the model.
  bool base64 = false;                   // encoding_format "base64".
};

// `input` (a string, token ids, or an array of either) or vLLM's `messages` (one
// conversation through the chat template, no reply prompt unless add_generation_prompt),
// `model`, `encoding_format`,
// `dimensions` (refused: the embeddings have the model's hidden size), and vLLM's
// `truncate_prompt_tokens`, `add_special_tokens`, `normalize` and `cache_salt`. InvalidArgument
// naming the field otherwise.
absl::StatusOr<EmbeddingsCall> parseEmbeddingsRequest(const nlohmann::json& body);

// The response body: one item per input, in order, and the prompt tokens in all.
nlohmann::json embeddingsResponse(const std::vector<v1::EmbedResponse>& embeddings, bool base64,
                                  const std::string& model);

// The floats' little-endian float32 bytes, base64-encoded (what OpenAI's clients decode).
std::string base64Floats(const google::protobuf::RepeatedField<float>& values);

}  // namespace cleave::router::openai
