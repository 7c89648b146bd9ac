// One-shot all-reduce over peer-to-peer GPU memory for the small messages of tensor
// parallelism (a decode step's activations: tens of KB), where NCCL's ring costs 13-45 us
// over PCIe and one kernel that pushes and sums costs a few.
//
// The GPUs are the rank threads' devices of one process, so each rank's buffers are
// addressable from every peer once peer access is on. Push, never pull (pull variants have
// hung on PCIe switches): each block of rank r writes its chunk of the data into slot r of
// every rank's inbox, fences, raises a flag in every rank's flag array, waits until every
// peer's flag for that chunk is up, then sums the chunk's slots in rank order — the same
// order on every rank, so every rank ends with the same bits.
//
// Inboxes alternate between two halves by call parity, and flags carry a per-block call
// count kept on the device (not a kernel argument), so a captured CUDA graph can replay the
// collective: a rank cannot reuse a half before every peer has finished reading it, because
// it waits for the peers' flags of the call in between.
//
// Threading: create() once for the group; then rank r's thread calls run(r, ...), every
// rank with the same count, in the same order of calls. A rank's calls must run one after
// another on the device (one stream, or the previous call finished): they share the call
// counts and inbox halves.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace cleave::cuda {

class P2pAllReduce {
 public:
  static constexpr int kMaxRanks = 8;
  // Checks that every pair of `devices` can reach each other, enables peer access, and
  // allocates each rank's inbox (2 x ranks x max_bytes) and flags. FailedPrecondition naming
  // the pair when one cannot (the caller falls back to NCCL).
  static absl::StatusOr<std::unique_ptr<P2pAllReduce>> create(const std::vector<int>& devices,
                                                              int64_t max_bytes = 256 << 10);
  ~P2pAllReduce();
  P2pAllReduce(const P2pAllReduce&) = delete;
  P2pAllReduce& operator=(const P2pAllReduce&) = delete;

  int ranks() const { return static_cast<int>(devices_.size()); }
  int64_t maxBytes() const { return max_bytes_; }

  enum class Dtype { kF32, kBf16 };  // bf16 is summed in f32, rounded once
  // data (count elements on rank `rank`'s device) = the sum over ranks, enqueued on `stream`.
  absl::Status run(int rank, void* data, int64_t count, Dtype dtype, cudaStream_t stream) const;
  absl::Status run(int rank, float* data, int64_t count, cudaStream_t stream) const {
    return run(rank, data, count, Dtype::kF32, stream);
  }
  // Releases every rank's kernels that wait for a peer which will never come (a rank whose
  // step failed); their results are garbage and the group is not to be used again.
  void abort() const;

 private:
  P2pAllReduce() = default;
  std::vector<int> devices_;
  int64_t max_bytes_ = 0;
  // Per rank, on its device.
  std::vector<uint8_t*> inbox_;      // [2][ranks][max_bytes]
  std::vector<uint32_t*> flags_;     // [ranks][kBlocks]: peer q's count for block b
  std::vector<uint32_t*> counters_;  // [kBlocks]: this rank's calls per block
  std::vector<void*> tables_;        // every rank's inbox and flags, for the kernel
  uint32_t* abort_host_ = nullptr;   // pinned, mapped: set by abort(), read by the kernels
  uint32_t* abort_device_ = nullptr;
};

}  // namespace cleave::cuda
