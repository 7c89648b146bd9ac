#include "services/loadgen/lengths.h"

#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace cleave::loadgen {
namespace {

absl::StatusOr<uint32_t> parseCount(absl::string_view text, absl::string_view what) {
  uint32_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", text, "' is not a token count >= 1 (use N or MIN:MAX)"));
  }
  return value;
}

}  // namespace

absl::StatusOr<LengthRange> LengthRange::parse(absl::string_view text, absl::string_view what) {
  const size_t colon = text.find(':');
  LengthRange range;
  if (colon == absl::string_view::npos) {
    absl::StatusOr<uint32_t> n = parseCount(text, what);
    if (!n.ok()) return n.status();
    range.min = range.max = *n;
    return range;
  }
  absl::StatusOr<uint32_t> lo = parseCount(text.substr(0, colon), what);
  if (!lo.ok()) return lo.status();
  absl::StatusOr<uint32_t> hi = parseCount(text.substr(colon + 1), what);
  if (!hi.ok()) return hi.status();
  if (*lo > *hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", text, "' has MIN > MAX; write MIN:MAX with MIN <= MAX"));
  }
  range.min = *lo;
  range.max = *hi;
  return range;
}

uint32_t LengthRange::sample(std::mt19937_64& rng) const {
  if (min == max) return min;
  return std::uniform_int_distribution<uint32_t>(min, max)(rng);
}

std::string LengthRange::toString() const {
  return min == max ? absl::StrCat(min) : absl::StrCat(min, ":", max);
}

absl::StatusOr<std::vector<RequestShape>> readLengthsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open lengths file ", path));
  std::vector<RequestShape> shapes;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", number);
    nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
    }
    auto count = [&](const char* field) -> absl::StatusOr<uint32_t> {
      auto it = row.find(field);
      if (it == row.end() || !it->is_number_unsigned() || it->get<uint64_t>() < 1 ||
          it->get<uint64_t>() > UINT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": \"", field, "\" must be an integer >= 1"));
      }
      return it->get<uint32_t>();
    };
    RequestShape shape;
    absl::StatusOr<uint32_t> output = count("output_tokens");
    if (!output.ok()) return output.status();
    shape.output_tokens = *output;
    if (auto prompt = row.find("prompt"); prompt != row.end()) {
      if (!prompt->is_string() || prompt->get<std::string>().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": \"prompt\" must be a non-empty string"));
      }
      shape.prompt = prompt->get<std::string>();
    } else {
      absl::StatusOr<uint32_t> tokens = count("prompt_tokens");
      if (!tokens.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": give \"prompt\" (text) or \"prompt_tokens\" (an integer >= 1)"));
      }
      shape.prompt_tokens = *tokens;
    }
    shapes.push_back(std::move(shape));
  }
  if (shapes.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " has no requests"));
  return shapes;
}

}  // namespace cleave::loadgen
