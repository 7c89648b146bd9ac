// libFuzzer target: a client's GenerateRequest (any bytes parsed as the message) through
// the router's model-independent validation.
#include <cstddef>
#include <cstdint>

#include "services/router/request_validation.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cleave::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  (void)cleave::router::validateGenerateRequest(request);
  return 0;
}
