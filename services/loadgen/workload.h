// The requests of a load test: request i's prompt and output length are a pure function of
// (seed, i), so a run is reproducible whatever order its clients send in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "services/loadgen/lengths.h"

namespace cleave::loadgen {

struct WorkloadOptions {
  LengthRange prompt_len{128, 128};
  LengthRange output_len{64, 64};
  // When non-empty, request i takes shapes[i % size] instead of the ranges.
  std::vector<RequestShape> shapes;
  // Random prompt tokens are drawn from [vocab_size / 16, vocab_size): past the special
  // tokens that vocabularies put first. Must be >= 16.
  uint32_t vocab_size = 0;
  uint64_t seed = 1;
  // Token prompts start with one of `prefix_groups` shared prefixes of this many tokens
  // (request i takes prefix i % prefix_groups), then their own prompt_len tokens: a system
  // prompt or document that many requests share, for prefix caching to reuse.
  uint32_t shared_prefix_len = 0;
  uint32_t prefix_groups = 1;
};

struct PlannedRequest {
  uint64_t index = 0;
  std::vector<uint32_t> prompt_ids;  // Empty when prompt_text is set.
  std::string prompt_text;
  uint32_t output_tokens = 0;  // Generated exactly (end-of-sequence is ignored).
};

class Workload {
 public:
  explicit Workload(WorkloadOptions options) : options_(std::move(options)) {}
  PlannedRequest at(uint64_t index) const;

 private:
  WorkloadOptions options_;
};

}  // namespace cleave::loadgen
