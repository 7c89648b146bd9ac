#include "services/worker/request_conversion.h"

#include "absl/strings/str_cat.h"

namespace cleave::worker {

absl::StatusOr<engine::GenerationRequest> toEngineRequest(uint64_t id, const RequestParts& parts,
                                                          const std::vector<uint32_t>& eos,
                                                          int64_t context_length) {
  engine::GenerationRequest r;
  r.id = id;
  r.prompt.assign(parts.prompt->begin(), parts.prompt->end());
  const v1::SamplingParams& s = *parts.sampling;
  r.sampling = {.temperature = s.has_temperature() ? s.temperature() : 1.0f,
                .top_k = s.has_top_k() ? s.top_k() : 0,
                .top_p = s.has_top_p() ? s.top_p() : 1.0f,
                .min_p = s.has_min_p() ? s.min_p() : 0.0f,
                .repetition_penalty = s.has_repetition_penalty() ? s.repetition_penalty() : 1.0f,
                .presence_penalty = s.has_presence_penalty() ? s.presence_penalty() : 0.0f,
                .frequency_penalty = s.has_frequency_penalty() ? s.frequency_penalty() : 0.0f,
                .seed = s.seed(),
                .logprobs = parts.logprobs ? static_cast<int32_t>(*parts.logprobs) : -1};
  if (absl::Status valid = engine::validateSamplingParams(r.sampling); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.", valid.message()));
  }
  r.adjustments.bias.assign(s.logit_bias().begin(), s.logit_bias().end());
  r.adjustments.allowed.assign(s.allowed_token_ids().begin(), s.allowed_token_ids().end());
  for (const v1::TokenIds& words : s.bad_words_token_ids())
    r.adjustments.banned.emplace_back(words.ids().begin(), words.ids().end());
  // A moved sequence's earlier output counts toward its banned sequences.
  if (!r.adjustments.banned.empty())
    r.output_in_prompt = std::min<int64_t>(parts.output_tokens, parts.prompt->size());
  const v1::StoppingCriteria& stop = *parts.stopping;
  r.stop.min_new_tokens = stop.min_new_tokens();
  if (!stop.ignore_eos()) r.stop.stop_token_ids = eos;
  if (s.response_format() == v1::RESPONSE_FORMAT_JSON_OBJECT ||
      s.response_format() == v1::RESPONSE_FORMAT_JSON_SCHEMA) {
    if (stop.ignore_eos() || eos.empty()) {
      return absl::InvalidArgumentError(
          "sampling.response_format: a JSON object ends with the end-of-sequence token; "
          "stopping.ignore_eos must not be set");
    }
    r.json_object = true;
    if (s.response_format() == v1::RESPONSE_FORMAT_JSON_SCHEMA) {
      absl::StatusOr<std::shared_ptr<const engine::JsonSchema>> schema =
          engine::JsonSchema::compile(s.json_schema());
      if (!schema.ok()) {
        return absl::Status(schema.status().code(),
                            absl::StrCat("sampling.json_schema: ", schema.status().message()));
      }
      r.json_schema = *std::move(schema);
    }
    r.output_in_prompt = std::min<int64_t>(parts.output_tokens, parts.prompt->size());
  }
  absl::StatusOr<std::shared_ptr<const engine::Regex>> pattern = engine::outputPattern(
      s.regex(), std::vector<std::string>(s.choice().begin(), s.choice().end()));
  if (!pattern.ok()) return pattern.status();
  absl::StatusOr<std::shared_ptr<const engine::Grammar>> grammar =
      engine::outputGrammar(s.grammar());
  if (!grammar.ok()) return grammar.status();
  if (*pattern != nullptr || *grammar != nullptr) {
    // One output constraint; its end is the end-of-sequence token.
    const char* field = *grammar != nullptr ? "sampling.grammar" : "sampling.regex/choice";
    if (r.json_object || (*pattern != nullptr && *grammar != nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " cannot be combined with a JSON response_format or another of them"));
    }
    if (stop.ignore_eos() || eos.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ": the output ends with the end-of-sequence token once it is whole; "
                       "stopping.ignore_eos must not be set"));
    }
    r.regex = *std::move(pattern);
    r.grammar = *std::move(grammar);
    r.output_in_prompt = std::min<int64_t>(parts.output_tokens, parts.prompt->size());
  }
  r.stop.stop_token_ids.insert(r.stop.stop_token_ids.end(), stop.stop_token_ids().begin(),
                               stop.stop_token_ids().end());
  r.stop.stop_strings.assign(stop.stop().begin(), stop.stop().end());
  r.stop.max_new_tokens = stop.has_max_new_tokens()
                              ? stop.max_new_tokens()
                              : context_length - static_cast<int64_t>(r.prompt.size());
  return r;
}

v1::FinishReason finishReason(engine::StopReason reason) {
  switch (reason) {
    case engine::StopReason::kStopToken: return v1::FINISH_REASON_STOP_TOKEN;
    case engine::StopReason::kStopString: return v1::FINISH_REASON_STOP_STRING;
    case engine::StopReason::kLength: return v1::FINISH_REASON_LENGTH;
    case engine::StopReason::kNone: break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

v1::TokenLogprob tokenLogprob(const engine::SampledToken& scored) {
  v1::TokenLogprob out;
  out.set_token_id(scored.token);
  out.set_logprob(scored.logprob);
  for (const auto& [token, logprob] : scored.top) {
    v1::TopLogprob* top = out.add_top();
    top->set_token_id(token);
    top->set_logprob(logprob);
  }
  return out;
}

v1::TokenLogprob tokenLogprob(const engine::TokenEvent& event) {
  return tokenLogprob(engine::SampledToken{
      .token = event.token, .logprob = event.logprob.value_or(0.0f), .top = event.top_logprobs});
}

}  // namespace cleave::worker
