// Reading an OpenAI-style request body: the refusal that names its field, and a field's
// lookup. Shared by the endpoints' parsers (openai_requests.h, responses_api.h).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace cleave::router::openai {

// InvalidArgument "PARAM: WHAT", with `param` attached as the kParamPayload payload
// (OpenAI's error "param").
absl::Status invalid(const std::string& param, const std::string& what);

// `name` in `body`: null when absent or JSON null.
const nlohmann::json* field(const nlohmann::json& body, const char* name);
// `name` in `object` when it is a string; null otherwise (`object` need not be an object).
const std::string* stringField(const nlohmann::json& object, const char* name);

}  // namespace cleave::router::openai
