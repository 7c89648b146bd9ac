// libFuzzer target: the safetensors header parser and dequantization of accepted tensors.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/model/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave::model;
  auto file = SafetensorsFile::parse(MappedFile::fromBuffer(
      "fuzz.safetensors", std::string(reinterpret_cast<const char*>(data), size)));
  if (!file.ok()) return 0;
  for (const SafetensorsTensor& tensor : (*file)->tensors()) {
    if (tensor.num_elements > (1u << 20)) continue;
    std::vector<float> out(tensor.num_elements);
    (void)dequantize(tensor.dtype, tensor.data, tensor.num_elements, out.data());
  }
  return 0;
}
