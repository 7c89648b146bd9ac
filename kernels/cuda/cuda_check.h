// Turning CUDA runtime errors into Status values that name the failing operation.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace cleave::cuda {

// OK for cudaSuccess. Otherwise ResourceExhausted for an allocation failure and Internal
// for anything else, with `op` and CUDA's own words: "rms_norm launch: invalid argument".
// The thread's last error is cleared, so a failure the caller tolerates (a P2P link that is
// not there) is not blamed on the next kernel launch; sticky errors stay.
inline absl::Status cudaStatus(cudaError_t error, std::string_view op) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  std::string message = std::string(op) + ": " + cudaGetErrorString(error);
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

// The error of the kernel launch just made on this thread (a bad configuration, too much
// shared memory), named after `op`.
inline absl::Status launchStatus(std::string_view op) {
  return cudaStatus(cudaGetLastError(), std::string(op) + " launch");
}

}  // namespace cleave::cuda
