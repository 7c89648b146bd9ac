// Reading an OpenAI-style request body: the refusal that names its field, and a field's
// lookup. Shared by the endpoints' parsers (openai_requests.h, responses_api.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cleave/v1/generation.pb.h"
#include "nlohmann/json.hpp"

namespace cleave::router::openai {

// InvalidArgument "PARAM: WHAT", with `param` attached as the kParamPayload payload
// (OpenAI's error "param").
absl::Status invalid(const std::string& param, const std::string& what);

// `name` in `body`: null when absent or JSON null.
const nlohmann::json* field(const nlohmann::json& body, const char* name);
// `name` in `object` when it is a string; null otherwise (`object` need not be an object).
const std::string* stringField(const nlohmann::json& object, const char* name);
// `name` in `body` as a boolean, `fallback` when absent; InvalidArgument naming it otherwise.
absl::StatusOr<bool> boolean(const nlohmann::json& body, const char* name, bool fallback);
// `name` in `body` as an integer in [lo, hi] (a whole float too, as Python clients send it);
// nullopt when absent; InvalidArgument naming it otherwise.
absl::StatusOr<std::optional<int64_t>> integer(const nlohmann::json& body, const char* name,
                                               int64_t lo, int64_t hi);
// vLLM's truncate_prompt_tokens: keep the prompt's last N tokens (-1: as many as the context
// allows); 0 when absent. InvalidArgument naming it for 0 or a value out of range.
absl::StatusOr<int32_t> truncatePromptTokens(const nlohmann::json& body);
// vLLM's cache_salt: the prefix cache is shared only among requests of one salt; empty when
// absent. InvalidArgument naming it for anything but a non-empty string.
absl::StatusOr<std::string> cacheSalt(const nlohmann::json& body);
// The chat fields of `body` into `chat`: messages (text content, or text parts joined),
// tools, chat_template_kwargs, continue_final_message, add_generation_prompt. InvalidArgument
// naming the field otherwise.
absl::Status parseChat(const nlohmann::json& body, v1::Chat& chat);
// The array `v` as token ids; InvalidArgument naming `name`[i] for one that is not.
absl::StatusOr<std::vector<uint32_t>> tokenIds(const nlohmann::json& v, const std::string& name);

}  // namespace cleave::router::openai
