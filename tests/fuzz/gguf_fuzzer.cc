// libFuzzer target: the GGUF parser and everything a loader reads after parsing
// (metadata getters, model config, dequantization of every accepted tensor).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/model/gguf_file.h"
#include "common/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave::model;
  auto file = GgufFile::parse(
      MappedFile::fromBuffer("fuzz.gguf", std::string(reinterpret_cast<const char*>(data), size)));
  if (!file.ok()) return 0;
  (void)configFromGguf(**file);
  (void)(*file)->getStringArray("tokenizer.ggml.tokens");
  for (const GgufTensor& tensor : (*file)->tensors()) {
    if (tensor.num_elements > (1u << 20)) continue;  // Accepted, but too big to be worth it.
    std::vector<float> out(tensor.num_elements);
    (void)dequantize(tensor.type, tensor.data, tensor.num_elements, out.data());
  }
  return 0;
}
