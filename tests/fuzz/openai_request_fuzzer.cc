// libFuzzer target: an HTTP client's request body (any bytes) through the HTTP API's
// parsers: completions, chat, the Responses API (with the body's own input items as a
// stored conversation too), the items a stored response keeps and their pages, Anthropic's
// Messages API (and its errors), tokenize, detokenize and embeddings.
#include <cstddef>
#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"
#include "services/router/messages_api.h"
#include "services/router/openai_embeddings.h"
#include "services/router/openai_fields.h"
#include "services/router/openai_requests.h"
#include "services/router/responses_api.h"

namespace openai = cleave::router::openai;
using Json = nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<Json> body =
      openai::parseBody(std::string(reinterpret_cast<const char*>(data), size));
  if (!body.ok()) return 0;
  (void)openai::parseCompletionRequest(*body);
  (void)openai::parseChatRequest(*body);
  (void)openai::parseResponsesRequest(*body);
  const Json* input = body->is_object() ? openai::field(*body, "input") : nullptr;
  const Json history = input != nullptr && input->is_array() ? *input : Json::array();
  (void)openai::parseResponsesRequest(*body, &history);
  (void)openai::parseMessagesRequest(*body);
  (void)openai::parseMessagesRequest(*body, /*counting=*/true);
  (void)openai::anthropicError(400, body->dump());
  (void)openai::parseTokenizeRequest(*body);
  (void)openai::parseDetokenizeRequest(*body);
  (void)openai::parseEmbeddingsRequest(*body);
  if (!body->is_object()) return 0;
  const Json items = openai::inputItems(*body);
  auto text = [&](const char* key) -> std::optional<std::string> {
    const Json* v = openai::field(*body, key);
    if (v == nullptr) return std::nullopt;
    return v->is_string() ? v->get<std::string>() : v->dump();
  };
  (void)openai::itemsPage(items, {text("limit"), text("order"), text("after")});
  return 0;
}
