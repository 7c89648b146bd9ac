// Collectives between the ranks of one tensor-parallel group (ARCHITECTURE §1): every rank
// calls the same collectives in the same order with buffers of the same sizes. Gloo on the
// CPU (gloo_communicator.h), NCCL on GPUs; a group of one needs no transport at all.
//
// Errors (a peer gone, a timeout) come back as a Status; a group that failed once is not
// used again.
//
// Threading: one rank thread uses a Communicator; each rank has its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"

namespace cleave::engine {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data = sum over ranks of data.
  virtual absl::Status allReduceSum(std::span<float> data) = 0;
  // Rank r contributes `counts[r]` floats (`in`, counts[rank()] of them); `out` receives
  // every rank's floats in rank order (sum of counts).
  virtual absl::Status allGather(std::span<const float> in, std::span<const int64_t> counts,
                                 std::span<float> out) = 0;
  // Every rank's `data` becomes rank `root`'s.
  virtual absl::Status broadcast(std::span<std::byte> data, int root) = 0;
  virtual absl::Status barrier() = 0;
};

// The communicator of a group of one: every collective is the identity.
std::unique_ptr<Communicator> soloCommunicator();

}  // namespace cleave::engine
