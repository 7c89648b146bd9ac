// A forward step run somewhere other than the CPU model: the seam through which a TpGroup
// hands its steps to another backend (the CUDA model, cuda_llama_model.h) while the
// scheduler above it stays the same. A tensor-parallel group has one backend per rank,
// made together (they may share a communicator group) and stepped together, each on its
// rank's thread.
//
// Threading: each backend is stepped by its rank's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "services/engine/llama_model.h"
#include "services/engine/llama_weights.h"

namespace cleave::engine {

class StepBackend {
 public:
  virtual ~StepBackend() = default;
  // As LlamaModel::forward, over the backend's own KV cache of the blocks it was made with.
  virtual absl::StatusOr<std::span<const float>> forward(std::span<const SequenceChunk> batch) = 0;
};

// Makes one backend per rank of a group, rank r's for ranks[r] (its shard of the weights,
// read only during the call), each with a KV pool of `num_blocks` blocks of `block_size`
// positions.
using StepBackendFactory = std::function<absl::StatusOr<std::vector<std::unique_ptr<StepBackend>>>(
    std::span<const LlamaWeights* const> ranks, int64_t num_blocks, int64_t block_size)>;

}  // namespace cleave::engine
