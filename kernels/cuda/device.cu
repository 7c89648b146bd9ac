#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"

namespace cleave::cuda {

absl::StatusOr<std::vector<DeviceInfo>> listDevices() {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaErrorInsufficientDriver || error == cudaErrorNoDevice) {
    cudaGetLastError();  // Clear the sticky error state.
    return std::vector<DeviceInfo>{};
  }
  if (error != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorString(error)));
  }
  std::vector<DeviceInfo> devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    error = cudaGetDeviceProperties(&prop, i);
    if (error != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("cudaGetDeviceProperties(", i, ") failed: ", cudaGetErrorString(error)));
    }
    devices.push_back({.index = i,
                       .name = prop.name,
                       .sm_major = prop.major,
                       .sm_minor = prop.minor,
                       .multiprocessors = prop.multiProcessorCount,
                       .total_memory_bytes = prop.totalGlobalMem});
  }
  return devices;
}

}  // namespace cleave::cuda
