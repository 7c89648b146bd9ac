// libFuzzer target: config.json parsing into a ModelConfig.
#include <cstddef>
#include <cstdint>

#include "common/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = cleave::model::parseConfigJson(
      absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
  if (config.ok()) {
    for (uint32_t layer = 0; layer < config->num_layers && layer < 64; ++layer) {
      (void)config->isMoeLayer(layer);
    }
  }
  return 0;
}
