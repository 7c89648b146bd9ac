// The sampling a model's authors recommend, from its generation_config.json (temperature,
// top_p, top_k, min_p, repetition_penalty), for requests that leave those unset — what
// vLLM's default `--generation-config auto` does. A GGUF file carries none.
//
// Threading: free functions; no shared state.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "cleave/v1/generation.pb.h"

namespace cleave::router {

// The defaults the model at `model` (a file or folder, as --model names it) recommends;
// unset fields where it says nothing (a file: nothing). InvalidArgument naming the file and
// field for a value no request could set.
absl::StatusOr<v1::SamplingParams> readSamplingDefaults(const std::string& model);

// Sets each field `defaults` sets that `sampling` leaves unset.
void applySamplingDefaults(const v1::SamplingParams& defaults, v1::SamplingParams& sampling);

// "temperature 0.6, top_p 0.95, top_k 20"; empty when none is set.
std::string describeSamplingDefaults(const v1::SamplingParams& defaults);

}  // namespace cleave::router
