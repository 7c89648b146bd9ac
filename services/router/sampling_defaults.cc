#include "services/router/sampling_defaults.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cleave::router {
namespace {

using Json = nlohmann::json;

absl::Status badField(const std::string& path, const char* field, const char* why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": field '", field, "' ", why));
}

// A number field within [lo, hi] (`open_lo`: above lo), if present and not null.
absl::StatusOr<std::optional<double>> number(const Json& j, const std::string& path,
                                             const char* field, double lo, double hi,
                                             bool open_lo = false) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return badField(path, field, "must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || (open_lo && v == lo) || v > hi) {
    return badField(
        path, field,
        absl::StrCat("is ", v, ", outside ", open_lo ? "(" : "[", lo, ", ", hi, "]").c_str());
  }
  return std::optional<double>(v);
}

}  // namespace

absl::StatusOr<v1::SamplingParams> readSamplingDefaults(const std::string& model) {
  namespace fs = std::filesystem;
  v1::SamplingParams defaults;
  std::error_code error;
  if (!fs::is_directory(model, error)) return defaults;
  const std::string path = (fs::path(model) / "generation_config.json").string();
  if (!fs::is_regular_file(path, error)) return defaults;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const Json j = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  absl::StatusOr<std::optional<double>> v = number(j, path, "temperature", 0, 1e6);
  if (!v.ok()) return v.status();
  if (*v) defaults.set_temperature(static_cast<float>(**v));
  if (!(v = number(j, path, "top_p", 0, 1, /*open_lo=*/true)).ok()) return v.status();
  if (*v) defaults.set_top_p(static_cast<float>(**v));
  if (!(v = number(j, path, "min_p", 0, 1)).ok()) return v.status();
  if (*v) defaults.set_min_p(static_cast<float>(**v));
  if (!(v = number(j, path, "repetition_penalty", 0, 1e6, /*open_lo=*/true)).ok())
    return v.status();
  if (*v) defaults.set_repetition_penalty(static_cast<float>(**v));
  if (!(v = number(j, path, "top_k", -1, 1 << 30)).ok()) return v.status();
  if (*v) {
    if (**v != std::floor(**v)) return badField(path, "top_k", "must be a whole number");
    // -1 and 0 turn the filter off, as in a request.
    defaults.set_top_k(static_cast<int32_t>(std::max(0.0, **v)));
  }
  return defaults;
}

void applySamplingDefaults(const v1::SamplingParams& defaults, v1::SamplingParams& sampling) {
  if (defaults.has_temperature() && !sampling.has_temperature())
    sampling.set_temperature(defaults.temperature());
  if (defaults.has_top_p() && !sampling.has_top_p()) sampling.set_top_p(defaults.top_p());
  if (defaults.has_top_k() && !sampling.has_top_k()) sampling.set_top_k(defaults.top_k());
  if (defaults.has_min_p() && !sampling.has_min_p()) sampling.set_min_p(defaults.min_p());
  if (defaults.has_repetition_penalty() && !sampling.has_repetition_penalty())
    sampling.set_repetition_penalty(defaults.repetition_penalty());
}

std::string describeSamplingDefaults(const v1::SamplingParams& d) {
  std::vector<std::string> parts;
  if (d.has_temperature()) parts.push_back(absl::StrCat("temperature ", d.temperature()));
  if (d.has_top_p()) parts.push_back(absl::StrCat("top_p ", d.top_p()));
  if (d.has_top_k()) parts.push_back(absl::StrCat("top_k ", d.top_k()));
  if (d.has_min_p()) parts.push_back(absl::StrCat("min_p ", d.min_p()));
  if (d.has_repetition_penalty())
    parts.push_back(absl::StrCat("repetition_penalty ", d.repetition_penalty()));
  return absl::StrJoin(parts, ", ");
}

}  // namespace cleave::router
