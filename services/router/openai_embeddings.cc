#include "services/router/openai_embeddings.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <ctime>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/router/openai_fields.h"
#include "services/router/openai_responses.h"

namespace cleave::router::openai {

using Json = nlohmann::json;

absl::StatusOr<EmbeddingsCall> parseEmbeddingsRequest(const Json& body) {
  EmbeddingsCall call;
  v1::EmbedRequest common;
  if (const Json* model = field(body, "model"); model != nullptr) {
    if (!model->is_string()) return invalid("model", "must be a string");
    common.set_model(model->get<std::string>());
  }
  if (const Json* format = field(body, "encoding_format"); format != nullptr) {
    if (!format->is_string() || (*format != "float" && *format != "base64"))
      return invalid("encoding_format", "must be \"float\" or \"base64\"");
    call.base64 = *format == "base64";
  }
  if (field(body, "dimensions") != nullptr) {
    return invalid("dimensions",
                   "is not supported: this model's embeddings have its hidden size, and it "
                   "was not trained to shorten them");
  }
  if (const Json* user = field(body, "user"); user != nullptr && !user->is_string())
    return invalid("user", "must be a string");
  CLEAVE_ASSIGN_OR_RETURN(const int32_t truncate, truncatePromptTokens(body));
  common.set_truncate_prompt_tokens(truncate);
  if (field(body, "add_special_tokens") != nullptr) {
    CLEAVE_ASSIGN_OR_RETURN(bool add, boolean(body, "add_special_tokens", true));
    common.set_add_special_tokens(add);
  }
  CLEAVE_ASSIGN_OR_RETURN(std::string salt, cacheSalt(body));
  common.set_cache_salt(std::move(salt));
  if (field(body, "normalize") != nullptr) {
    CLEAVE_ASSIGN_OR_RETURN(bool normalize, boolean(body, "normalize", true));
    common.set_normalize(normalize);
  }

  // vLLM's chat form: one conversation, rendered by the chat template; no reply prompt
  // unless asked (add_generation_prompt).
  if (field(body, "messages") != nullptr) {
    if (field(body, "input") != nullptr)
      return invalid("input", "send input or messages, not both");
    v1::EmbedRequest request = common;
    v1::Chat& chat = *request.mutable_chat();
    CLEAVE_RETURN_IF_ERROR(parseChat(body, chat));
    if (field(body, "add_generation_prompt") == nullptr) chat.set_add_generation_prompt(false);
    call.inputs.push_back(std::move(request));
    return call;
  }
  const Json* input = field(body, "input");
  if (input == nullptr) return invalid("input", "is required (or messages)");
  auto add = [&](const Json& one, const std::string& name) -> absl::Status {
    v1::EmbedRequest request = common;
    if (one.is_string()) {
      if (one.get_ref<const std::string&>().empty()) return invalid(name, "must not be empty");
      request.set_text(one.get<std::string>());
    } else if (one.is_array()) {
      if (one.empty()) return invalid(name, "must not be empty");
      CLEAVE_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, tokenIds(one, name));
      request.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
    } else {
      return invalid(name, "must be a string or an array of token ids");
    }
    call.inputs.push_back(std::move(request));
    return absl::OkStatus();
  };
  // One input (a string, or token ids), or an array of them.
  const bool many = input->is_array() && !input->empty() &&
                    std::all_of(input->begin(), input->end(),
                                [](const Json& v) { return v.is_string() || v.is_array(); });
  if (!many) {
    CLEAVE_RETURN_IF_ERROR(add(*input, "input"));
  } else {
    if (input->size() > static_cast<size_t>(kMaxEmbeddingInputs)) {
      return invalid("input", absl::StrCat(input->size(), " inputs; at most ", kMaxEmbeddingInputs,
                                           " per request"));
    }
    for (size_t i = 0; i < input->size(); ++i)
      CLEAVE_RETURN_IF_ERROR(add((*input)[i], absl::StrCat("input[", i, "]")));
  }
  return call;
}

std::string base64Floats(const google::protobuf::RepeatedField<float>& values) {
  std::string bytes(static_cast<size_t>(values.size()) * sizeof(float), '\0');
  for (int i = 0; i < values.size(); ++i) {
    uint32_t bits = std::bit_cast<uint32_t>(values[i]);
    for (int b = 0; b < 4; ++b) bytes[4 * i + b] = static_cast<char>((bits >> (8 * b)) & 0xff);
  }
  return absl::Base64Escape(bytes);
}

Json embeddingsResponse(const std::vector<v1::EmbedResponse>& embeddings, bool base64,
                        const std::string& model) {
  Json data = Json::array();
  int64_t tokens = 0;
  for (size_t i = 0; i < embeddings.size(); ++i) {
    const v1::EmbedResponse& e = embeddings[i];
    tokens += e.prompt_tokens();
    Json vector = base64 ? Json(base64Floats(e.embedding())) : Json::array();
    if (!base64) {
      for (float v : e.embedding()) vector.push_back(v);
    }
    data.push_back({{"index", i}, {"object", "embedding"}, {"embedding", std::move(vector)}});
  }
  return Json{{"id", absl::StrCat("embd-", randomId())},
              {"object", "list"},
              {"created", static_cast<int64_t>(std::time(nullptr))},
              {"model", model},
              {"data", std::move(data)},
              {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
}

}  // namespace cleave::router::openai
