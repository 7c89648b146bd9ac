#include "services/worker/gpu_setup.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

#if CLEAVE_HAVE_CUDA
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe_gemm.h"
#include "services/engine/cuda_llama_model.h"
#include "services/engine/memory_plan.h"
#endif

namespace cleave::worker {

#if CLEAVE_HAVE_CUDA

namespace {

// Rows of logits a step can ask for: a row per sequence, a draft's each, and the rows of
// prompts scored for log-probabilities (engine::kPromptLogprobRows in all).
engine::CudaModelOptions modelOptions(const WorkerOptions& options, int64_t max_step_tokens,
                                      int64_t max_sequences) {
  const int64_t step_tokens = std::max(max_step_tokens, max_sequences);
  return {.max_step_tokens = step_tokens,
          .max_sequences = max_sequences,
          .max_logit_rows = std::min(step_tokens, max_sequences * (1 + options.speculative.tokens) +
                                                      engine::kPromptLogprobRows),
          .kv_dtype = engine::gpuKvDtype(kvType(options))};
}

}  // namespace

absl::StatusOr<engine::StepBackendFactory> gpuBackend(const WorkerOptions& options,
                                                      int64_t max_step_tokens,
                                                      int64_t max_sequences) {
  return engine::cudaStepBackend(modelOptions(options, max_step_tokens, max_sequences));
}

absl::StatusOr<engine::BackendMemoryEstimator> gpuBackendMemory(const WorkerOptions& options,
                                                                int64_t max_step_tokens,
                                                                int64_t max_sequences) {
  return engine::cudaBackendMemory(modelOptions(options, max_step_tokens, max_sequences));
}

absl::StatusOr<roofline::Hardware> gpuHardware(model::TensorType weights) {
  auto devices = cuda::listDevices();
  if (!devices.ok()) return devices.status();
  if (devices->empty()) return absl::NotFoundError("no CUDA device");
  std::string name = (*devices)[0].name;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // Device names as the driver reports them, e.g. "NVIDIA H200", "NVIDIA RTX PRO 6000
  // Blackwell Server Edition", "NVIDIA GeForce RTX 5090".
  const std::pair<const char*, const char*> known[] = {{"h200", "h200"},
                                                       {"h100", "h100"},
                                                       {"b200", "b200"},
                                                       {"rtx pro 6000", "rtx-pro-6000"},
                                                       {"rtx 5090", "rtx-5090"}};
  // The peak of the products as they run here: FP8 and E2M1 weights meet quantized
  // activations only where the GPU has the native MMA (moe_gemm.h); elsewhere bf16.
  using cuda::ExpertWeightFormat;
  const char* dtype =
      weights == model::TensorType::kF8E4M3 &&
              cuda::nativeOperandsPreferred(ExpertWeightFormat::kFp8Block128)
          ? "fp8"
      : (weights == model::TensorType::kE2M1 || weights == model::TensorType::kNVFP4) &&
              cuda::nativeOperandsPreferred(ExpertWeightFormat::kNvfp4)
          ? "fp4"
          : "bf16";
  for (const auto& [part, profile] : known) {
    if (name.find(part) != std::string::npos) return roofline::builtinHardware(profile, dtype);
  }
  return absl::NotFoundError(
      absl::StrCat("no roofline profile for GPU '", (*devices)[0].name, "'"));
}

#else

absl::StatusOr<engine::StepBackendFactory> gpuBackend(const WorkerOptions&, int64_t, int64_t) {
  return absl::UnimplementedError(
      "this build has no CUDA backend: configure with -DCLEAVE_CUDA=ON where nvcc exists");
}

absl::StatusOr<engine::BackendMemoryEstimator> gpuBackendMemory(const WorkerOptions&, int64_t,
                                                                int64_t) {
  return absl::UnimplementedError("this build has no CUDA backend");
}

absl::StatusOr<roofline::Hardware> gpuHardware(model::TensorType) {
  return absl::UnimplementedError("this build has no CUDA backend");
}

#endif

}  // namespace cleave::worker
