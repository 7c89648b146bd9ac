#include "services/router/request_validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "services/engine/grammar.h"
#include "services/engine/json_schema.h"
#include "services/engine/kv_block_pool.h"
#include "services/engine/logit_adjustments.h"
#include "services/engine/regex.h"

namespace cleave::router {
namespace {

absl::Status invalid(absl::string_view field, absl::string_view rule, auto value) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", rule, ", got ", value));
}

absl::Status validateSampling(const v1::SamplingParams& s) {
  if (s.has_temperature() && !(std::isfinite(s.temperature()) && s.temperature() >= 0)) {
    return invalid("sampling.temperature", "must be a finite number >= 0 (0 means greedy)",
                   s.temperature());
  }
  if (s.has_top_p() && !(s.top_p() > 0 && s.top_p() <= 1)) {
    return invalid("sampling.top_p", "must be in (0, 1]", s.top_p());
  }
  if (s.has_top_k() && s.top_k() < 0) {
    return invalid("sampling.top_k", "must be >= 0 (0 disables it)", s.top_k());
  }
  if (s.has_min_p() && !(s.min_p() >= 0 && s.min_p() <= 1)) {
    return invalid("sampling.min_p", "must be in [0, 1]", s.min_p());
  }
  if (s.has_repetition_penalty() &&
      !(std::isfinite(s.repetition_penalty()) && s.repetition_penalty() > 0)) {
    return invalid("sampling.repetition_penalty", "must be a finite number > 0 (1 disables it)",
                   s.repetition_penalty());
  }
  if (s.has_presence_penalty() && !(s.presence_penalty() >= -2 && s.presence_penalty() <= 2)) {
    return invalid("sampling.presence_penalty", "must be in [-2, 2]", s.presence_penalty());
  }
  if (s.has_frequency_penalty() && !(s.frequency_penalty() >= -2 && s.frequency_penalty() <= 2)) {
    return invalid("sampling.frequency_penalty", "must be in [-2, 2]", s.frequency_penalty());
  }
  if (s.logit_bias_size() > kMaxLogitBiasEntries) {
    return invalid("sampling.logit_bias",
                   absl::StrCat("may hold at most ", kMaxLogitBiasEntries, " tokens"),
                   s.logit_bias_size());
  }
  for (const auto& [token, bias] : s.logit_bias()) {
    if (!(std::isfinite(bias) && std::fabs(bias) <= engine::kMaxLogitBias)) {
      return invalid(absl::StrCat("sampling.logit_bias[", token, "]"), "must be in [-100, 100]",
                     bias);
    }
  }
  if (s.allowed_token_ids_size() > kMaxAllowedTokens) {
    return invalid("sampling.allowed_token_ids",
                   absl::StrCat("may hold at most ", kMaxAllowedTokens, " tokens"),
                   s.allowed_token_ids_size());
  }
  return absl::OkStatus();
}

absl::Status validateStopping(const v1::StoppingCriteria& s) {
  if (s.has_max_new_tokens() && s.max_new_tokens() == 0) {
    return invalid("stopping.max_new_tokens", "must be >= 1 (leave it unset for no limit)", 0);
  }
  if (s.has_min_new_tokens() && s.has_max_new_tokens() && s.min_new_tokens() > s.max_new_tokens()) {
    return invalid(
        "stopping.min_new_tokens",
        absl::StrCat("must not exceed stopping.max_new_tokens (", s.max_new_tokens(), ")"),
        s.min_new_tokens());
  }
  if (static_cast<size_t>(s.stop_size()) > kMaxStopStrings) {
    return invalid("stopping.stop", absl::StrCat("may hold at most ", kMaxStopStrings, " strings"),
                   s.stop_size());
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    const std::string& stop = s.stop(i);
    std::string field = absl::StrCat("stopping.stop[", i, "]");
    if (stop.empty()) return invalid(field, "must not be empty", "\"\"");
    if (stop.size() > kMaxStopStringBytes) {
      return invalid(field, absl::StrCat("must be at most ", kMaxStopStringBytes, " bytes"),
                     absl::StrCat(stop.size(), " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status validateChat(const v1::Chat& chat) {
  if (chat.messages().empty()) {
    return absl::InvalidArgumentError("chat.messages is empty; send at least one message");
  }
  for (int i = 0; i < chat.messages_size(); ++i) {
    if (chat.messages(i).role().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat.messages[", i, "].role is empty; set it (\"system\", \"user\", \"assistant\"...)"));
    }
  }
  return absl::OkStatus();
}

absl::Status validateGenerateRequest(const v1::GenerateRequest& request) {
  switch (request.input_case()) {
    case v1::GenerateRequest::kText:
      if (request.text().empty()) {
        return absl::InvalidArgumentError("text is empty; send a non-empty prompt");
      }
      break;
    case v1::GenerateRequest::kTokenIds:
      if (request.token_ids().ids().empty()) {
        return absl::InvalidArgumentError("token_ids.ids is empty; send at least one token id");
      }
      break;
    case v1::GenerateRequest::kChat:
      if (request.chat().messages().empty()) {
        return absl::InvalidArgumentError("chat.messages is empty; send at least one message");
      }
      for (int i = 0; i < request.chat().messages_size(); ++i) {
        if (request.chat().messages(i).role().empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("chat.messages[", i,
                           "].role is empty; set it (\"system\", \"user\", \"assistant\"...)"));
        }
      }
      break;
    case v1::GenerateRequest::INPUT_NOT_SET:
      return absl::InvalidArgumentError("no input: set text, token_ids or chat");
  }
  if (request.has_logprobs() && request.logprobs() > kMaxLogprobs) {
    return invalid("logprobs", absl::StrCat("must be at most ", kMaxLogprobs), request.logprobs());
  }
  if (request.has_prompt_logprobs() && request.prompt_logprobs() > kMaxLogprobs) {
    return invalid("prompt_logprobs", absl::StrCat("must be at most ", kMaxLogprobs),
                   request.prompt_logprobs());
  }
  if (!request.sampling().allowed_token_ids().empty() &&
      request.sampling().response_format() != v1::RESPONSE_FORMAT_TEXT) {
    return absl::InvalidArgumentError(
        "sampling.allowed_token_ids cannot be combined with a JSON response_format");
  }
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return invalid("request_id", absl::StrCat("must be at most ", kMaxRequestIdBytes, " bytes"),
                   absl::StrCat(request.request_id().size(), " bytes"));
  }
  if (request.cache_salt().size() > engine::kMaxCacheSaltBytes) {
    return invalid("cache_salt",
                   absl::StrCat("must be at most ", engine::kMaxCacheSaltBytes, " bytes"),
                   absl::StrCat(request.cache_salt().size(), " bytes"));
  }
  if (absl::Status s = validateSampling(request.sampling()); !s.ok()) return s;
  if (!v1::ResponseFormat_IsValid(request.sampling().response_format())) {
    return invalid("sampling.response_format", "is not a ResponseFormat",
                   request.sampling().response_format());
  }
  const v1::ResponseFormat format = request.sampling().response_format();
  if (format != v1::RESPONSE_FORMAT_TEXT && request.stopping().min_new_tokens() > 0) {
    return absl::InvalidArgumentError(
        "stopping.min_new_tokens cannot hold off the end of a JSON output "
        "(sampling.response_format)");
  }
  if (format != v1::RESPONSE_FORMAT_TEXT && request.stopping().ignore_eos()) {
    return absl::InvalidArgumentError(
        "sampling.response_format: a JSON object ends with the end-of-sequence token; "
        "stopping.ignore_eos must not be set");
  }
  if (format != v1::RESPONSE_FORMAT_JSON_SCHEMA && !request.sampling().json_schema().empty()) {
    return absl::InvalidArgumentError(
        "sampling.json_schema is set but sampling.response_format is not "
        "RESPONSE_FORMAT_JSON_SCHEMA");
  }
  if (format == v1::RESPONSE_FORMAT_JSON_SCHEMA) {
    if (request.sampling().json_schema().size() > kMaxJsonSchemaBytes) {
      return invalid("sampling.json_schema", "must be at most 1 MiB",
                     absl::StrCat(request.sampling().json_schema().size(), " bytes"));
    }
    absl::StatusOr<std::shared_ptr<const engine::JsonSchema>> schema =
        engine::JsonSchema::compile(request.sampling().json_schema());
    if (!schema.ok()) {
      return absl::Status(schema.status().code(),
                          absl::StrCat("sampling.json_schema: ", schema.status().message()));
    }
  }
  const v1::SamplingParams& sampling = request.sampling();
  const bool patterned = !sampling.regex().empty() || !sampling.choice().empty();
  const bool grammar = !sampling.grammar().empty();
  if (patterned || grammar) {
    const char* field = grammar ? "sampling.grammar" : "sampling.regex and sampling.choice";
    if (patterned && grammar) {
      return absl::InvalidArgumentError(
          "sampling.grammar cannot be combined with sampling.regex or sampling.choice");
    }
    if (format != v1::RESPONSE_FORMAT_TEXT) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " cannot be combined with a JSON response_format"));
    }
    if (!sampling.allowed_token_ids().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.allowed_token_ids cannot be combined with ", field));
    }
    if (request.stopping().ignore_eos() || request.stopping().min_new_tokens() > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ": the output ends with the end-of-sequence token once it is whole; "
                       "stopping.ignore_eos and min_new_tokens must not be set"));
    }
    const absl::Status compiled =
        grammar ? engine::outputGrammar(sampling.grammar()).status()
                : engine::outputPattern(
                      sampling.regex(),
                      std::vector<std::string>(sampling.choice().begin(), sampling.choice().end()))
                      .status();
    if (!compiled.ok()) return compiled;
  }
  return validateStopping(request.stopping());
}

}  // namespace cleave::router
