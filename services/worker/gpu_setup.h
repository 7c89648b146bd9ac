// The GPU side of a worker (--backend cuda): the step backend its TpGroup runs on, and the
// roofline profile of the GPU that its step floors use.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/model/tensor_type.h"
#include "services/engine/step_backend.h"
#include "services/roofline/roofline.h"
#include "services/worker/worker_options.h"

namespace cleave::worker {

// A factory making one CUDA model per rank (rank r on GPU r) for steps of at most
// `max_step_tokens` tokens and `max_sequences` sequences. Unimplemented in a build without
// the CUDA backend.
absl::StatusOr<engine::StepBackendFactory> gpuBackend(const WorkerOptions& options,
                                                      int64_t max_step_tokens,
                                                      int64_t max_sequences);

// What those backends would hold (engine::cudaBackendMemory) for the worker's memory plan.
absl::StatusOr<engine::BackendMemoryEstimator> gpuBackendMemory(const WorkerOptions& options,
                                                                int64_t max_step_tokens,
                                                                int64_t max_sequences);

// The built-in profile (roofline.h) of GPU 0 by its name, at the peak of the products as
// the GPU runs them (FP8 or E2M1 where it has their native MMA, else bf16); NotFound naming
// the GPU when no profile matches.
absl::StatusOr<roofline::Hardware> gpuHardware(model::TensorType weights);

}  // namespace cleave::worker
