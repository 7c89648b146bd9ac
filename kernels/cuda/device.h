// CUDA devices visible to this process.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cleave::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  int multiprocessors = 0;
  size_t total_memory_bytes = 0;
};

// The visible devices. A machine without a CUDA driver or without devices has none: that
// is an empty list, not an error. Other CUDA failures are errors naming the call.
absl::StatusOr<std::vector<DeviceInfo>> listDevices();

}  // namespace cleave::cuda
