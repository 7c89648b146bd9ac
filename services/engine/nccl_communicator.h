// The Communicator of a tensor-parallel group on GPUs: NCCL, one communicator per rank,
// created together for the group's devices in one process (one rank thread per device,
// ARCHITECTURE §1).
//
// All-reduces of at most 256 KiB (a decode step's activations) take the one-shot P2P kernel
// (kernels/cuda/p2p_allreduce.h) when every pair of the group's GPUs can reach each other;
// createGroup logs which way it went. Larger ones, and groups without P2P, use NCCL.
//
// Buffers are device memory of the rank's GPU. Collectives are enqueued on the rank's
// stream() and this call waits for them, as the Communicator contract says (data is
// final when the call returns); kernels that follow on the same stream could skip the
// wait, which a CUDA graph of a whole step will do.
//
// Threading: as Communicator — each rank's communicator is used by its own rank thread.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/p2p_allreduce.h"
#include "services/engine/communicator.h"

namespace cleave::engine {

class NcclCommunicator : public Communicator {
 public:
  // One communicator per device in `devices` (rank r on devices[r]). Errors name the NCCL
  // or CUDA call that failed (no devices, a device twice, NCCL cannot start).
  // `p2p` false keeps every all-reduce on NCCL.
  static absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> createGroup(
      const std::vector<int>& devices, bool p2p = true);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status allReduceSum(std::span<float> data) override;
  absl::Status allGather(std::span<const float> in, std::span<const int64_t> counts,
                         std::span<float> out) override;
  absl::Status broadcast(std::span<std::byte> data, int root) override;
  absl::Status barrier() override;

  // Enqueue-only collectives on `stream`, what a GPU model calls inside its step (a CUDA
  // graph may capture them): the data is final when the stream gets past them. bf16 sums
  // accumulate in f32 on the P2P path, in NCCL's own way above it.
  absl::Status enqueueAllReduceBf16(void* data, int64_t count, cudaStream_t stream);
  // f32 sums over NCCL (a few values a row: Q and K normed across heads).
  absl::Status enqueueAllReduceF32(float* data, int64_t count, cudaStream_t stream);
  absl::Status enqueueAllGather(const float* in, std::span<const int64_t> counts, float* out,
                                cudaStream_t stream);

  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  // Whether small all-reduces go over P2P.
  bool p2p() const { return p2p_ != nullptr; }
  // Ends every rank's collectives of the group now (ncclCommRevoke on each — ncclCommAbort
  // where the NCCL loaded has no revoke —, the P2P kernels released): for a rank that cannot
  // finish its step, so its peers do not wait forever.
  // Every later collective of the group fails. Any rank's thread may call it.
  void abortGroup();
  // FailedPrecondition once the group was aborted (every collective checks it first; a
  // collective already past the check when another rank aborts fails inside NCCL).
  absl::Status usable() const;

 private:
  NcclCommunicator() = default;
  absl::Status finish(const char* op);

  void* comm_ = nullptr;  // ncclComm_t
  cudaStream_t stream_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  float* scratch_ = nullptr;                       // one float, for barrier()
  std::shared_ptr<const cuda::P2pAllReduce> p2p_;  // the group's, or null
  struct Group;
  std::shared_ptr<Group> group_;  // what every rank's communicator shares
  // The stream of this rank's last P2P all-reduce: its calls must run one after another
  // (they share inbox halves and call counts), so a call on another stream first waits for
  // the device. A model warms up (runs eagerly) before it captures, so a capture never
  // switches streams.
  cudaStream_t p2p_stream_ = nullptr;
  absl::Status orderP2p(cudaStream_t stream);
};

}  // namespace cleave::engine
