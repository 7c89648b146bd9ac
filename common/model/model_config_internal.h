// Pieces of reading a ModelConfig that the config.json reader (model_config_json.cc), the GGUF
// reader (model_config_gguf.cc) and model_config.cc share. Internal to cleave_model.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "common/model/model_config.h"

namespace cleave::model {

// A supported family: its config.json model_type, its GGUF general.architecture ("-": none
// is read), and the graph that runs it.
struct ArchName {
  const char* hf;    // config.json model_type
  const char* gguf;  // general.architecture
  Architecture arch;
};
std::span<const ArchName> architectures();

// longrope's context stretch and attention factor, as transformers derives them: the
// pretraining context is `original` (0: the model's whole context), the stretch `factor`
// when the file states one, else the model's context over the original.
void finishLongrope(uint32_t original, std::optional<double> factor, ModelConfig& c);

// Adds `id` to the ids generation stops at, once.
void addStopId(ModelConfig& c, uint32_t id);

// The shape checks every config passes, errors naming `source`.
absl::Status checkShape(const ModelConfig& c, const std::string& source);

}  // namespace cleave::model
