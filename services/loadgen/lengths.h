// Prompt and output lengths for a load test: a fixed length ("128"), a uniform range
// ("64:256", both ends included), or pairs read from a file.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cleave::loadgen {

struct LengthRange {
  uint32_t min = 1;
  uint32_t max = 1;

  // "N" or "MIN:MAX" with 1 <= MIN <= MAX. `what` names the flag in errors.
  static absl::StatusOr<LengthRange> parse(absl::string_view text, absl::string_view what);
  uint32_t sample(std::mt19937_64& rng) const;
  std::string toString() const;
};

// One request's shape from a lengths file. `prompt` is the prompt text when the file gives
// one (then prompt_tokens is 0: the router tokenizes it).
struct RequestShape {
  std::string prompt;
  uint32_t prompt_tokens = 0;
  uint32_t output_tokens = 0;
};

// Reads a JSON-lines file, one request per line:
//   {"prompt_tokens": 512, "output_tokens": 128}   or   {"prompt": "text", "output_tokens": 64}
// Blank lines are skipped. Errors name the file, the line and the field.
absl::StatusOr<std::vector<RequestShape>> readLengthsFile(const std::string& path);

}  // namespace cleave::loadgen
