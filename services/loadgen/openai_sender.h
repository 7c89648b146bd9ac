// A Sender (load_runner.h) that streams each request through an OpenAI-compatible HTTP API
// (POST /v1/completions, or /v1/chat/completions for text prompts sent as user turns):
// Cleave's router (--http-listen) or any other server that speaks the API, measured by the
// same runner as the gRPC sender.
//
// Each request asks for exactly its output length (max_tokens, with vLLM's ignore_eos
// extension) and the usage chunk. Every event that carries text counts as one token as it
// arrives; tokens the final usage reports beyond those arrive with the last event.
//
// Threading: the returned Sender may be called from several threads at once.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "services/loadgen/load_runner.h"

namespace cleave::loadgen {

struct OpenAiTarget {
  std::string host;
  int port = 0;
  std::string model;  // "model" of every request; empty: the server's only one
  bool chat = false;  // text prompts as user turns (/v1/chat/completions)
  double temperature = 0;
  int64_t timeout_s = 600;
  std::string api_key;  // sent as "Authorization: Bearer KEY" when set
};

// "http://HOST:PORT" (a trailing "/" or "/v1" is allowed) into host and port.
absl::Status parseOpenAiUrl(const std::string& url, OpenAiTarget& target);

Sender openAiSender(OpenAiTarget target);

// GET /v1/models: the first model's id and, when the server says (Cleave's router does),
// its vocabulary size (0 otherwise).
struct OpenAiModel {
  std::string id;
  uint32_t vocab_size = 0;
};
absl::StatusOr<OpenAiModel> openAiModel(const OpenAiTarget& target);

}  // namespace cleave::loadgen
