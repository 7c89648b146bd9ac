#include "services/engine/nccl_communicator.h"

#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "kernels/cuda/cuda_check.h"

namespace cleave::engine {
namespace {

absl::Status ncclStatus(ncclResult_t result, const char* op) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("NCCL ", op, ": ", ncclGetErrorString(result)));
}

// ncclCommRevoke (NCCL 2.28 and later): stops a communicator's in-flight work and frees
// nothing. Looked up when the loaded NCCL is older than the headers.
using RevokeFn = ncclResult_t (*)(ncclComm_t, int);
RevokeFn revokeFunction() {
  static const RevokeFn revoke = reinterpret_cast<RevokeFn>(dlsym(RTLD_DEFAULT, "ncclCommRevoke"));
  return revoke;
}

}  // namespace

// The group's communicators, for abortGroup(); each rank's destructor frees its own unless
// the group was aborted with ncclCommAbort (which frees them all).
struct NcclCommunicator::Group {
  absl::Mutex mu;
  std::vector<ncclComm_t> comms ABSL_GUARDED_BY(mu);
  bool aborted ABSL_GUARDED_BY(mu) = false;
  bool freed ABSL_GUARDED_BY(mu) = false;  // Aborted with ncclCommAbort, not revoked.
  std::atomic<bool> aborted_flag{false};   // The same, readable without the lock.
  bool isAborted() const { return aborted_flag.load(std::memory_order_acquire); }
};

absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> NcclCommunicator::createGroup(
    const std::vector<int>& devices, bool p2p) {
  if (devices.empty()) return absl::InvalidArgumentError("an NCCL group needs a device");
  if (std::set<int>(devices.begin(), devices.end()).size() != devices.size())
    return absl::InvalidArgumentError("an NCCL group lists a device twice");
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(n);
  if (absl::Status s = ncclStatus(ncclCommInitAll(comms.data(), n, devices.data()), "init");
      !s.ok())
    return s;
  std::vector<std::unique_ptr<NcclCommunicator>> group;
  auto shared_group = std::make_shared<Group>();
  {
    absl::MutexLock lock(&shared_group->mu);
    shared_group->comms = comms;
  }
  for (int r = 0; r < n; ++r) {
    std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
    c->group_ = shared_group;
    c->comm_ = comms[r];
    c->rank_ = r;
    c->size_ = n;
    c->device_ = devices[r];
    group.push_back(std::move(c));
  }
  for (auto& c : group) {
    if (absl::Status s = cuda::cudaStatus(cudaSetDevice(c->device_), "selecting a GPU"); !s.ok())
      return s;
    if (absl::Status s = cuda::cudaStatus(
            cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking), "creating a stream");
        !s.ok())
      return s;
    if (absl::Status s = cuda::cudaStatus(
            cudaMalloc(reinterpret_cast<void**>(&c->scratch_), sizeof(float)), "barrier scratch");
        !s.ok())
      return s;
  }
  if (n > 1 && p2p) {
    auto shared = cuda::P2pAllReduce::create(devices);
    if (shared.ok()) {
      CLEAVE_LOG(INFO) << "tensor parallel over " << n << " GPUs: one-shot P2P all-reduce up to "
                       << ((*shared)->maxBytes() >> 10) << " KiB, NCCL above";
      std::shared_ptr<const cuda::P2pAllReduce> common(std::move(*shared));
      for (auto& c : group) c->p2p_ = common;
    } else {
      CLEAVE_LOG(INFO) << "tensor parallel over " << n << " GPUs: P2P all-reduce unavailable ("
                       << shared.status().message() << "); NCCL for every all-reduce";
    }
  }
  return group;
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device_);
  if (scratch_) cudaFree(scratch_);
  if (stream_) cudaStreamDestroy(stream_);
  if (!group_) return;
  absl::MutexLock lock(&group_->mu);
  // Under the lock: an abort on another thread either freed it already or will skip it. A
  // revoked communicator is quiescent: abort frees it without waiting for its peers (the
  // CUDA graphs that captured it are gone by now, with the model that made them).
  if (comm_ && !group_->freed) {
    if (group_->aborted) {
      ncclCommAbort(static_cast<ncclComm_t>(comm_));
    } else {
      ncclCommDestroy(static_cast<ncclComm_t>(comm_));
    }
  }
  group_->comms[rank_] = nullptr;
}

absl::Status NcclCommunicator::usable() const {
  if (group_ && group_->isAborted())
    return absl::FailedPreconditionError(
        "the tensor-parallel group was aborted after a rank failed; it is not used again");
  return absl::OkStatus();
}

absl::Status NcclCommunicator::finish(const char* op) {
  return cuda::cudaStatus(cudaStreamSynchronize(stream_), absl::StrCat("NCCL ", op));
}

absl::Status NcclCommunicator::allReduceSum(std::span<float> data) {
  if (absl::Status s = usable(); !s.ok()) return s;
  if (absl::Status s = cuda::cudaStatus(cudaSetDevice(device_), "selecting a GPU"); !s.ok())
    return s;
  if (p2p_ != nullptr && static_cast<int64_t>(data.size_bytes()) <= p2p_->maxBytes()) {
    if (absl::Status s = orderP2p(stream_); !s.ok()) return s;
    if (absl::Status s = p2p_->run(rank_, data.data(), static_cast<int64_t>(data.size()), stream_);
        !s.ok())
      return s;
    return finish("p2p all-reduce");
  }
  if (absl::Status s = ncclStatus(ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat,
                                                ncclSum, static_cast<ncclComm_t>(comm_), stream_),
                                  "all-reduce");
      !s.ok())
    return s;
  return finish("all-reduce");
}

void NcclCommunicator::abortGroup() {
  if (p2p_) p2p_->abort();
  if (!group_) return;
  absl::MutexLock lock(&group_->mu);
  if (group_->aborted) return;
  group_->aborted = true;
  group_->aborted_flag.store(true, std::memory_order_release);
  // Revoked, the communicators stop their work and stay allocated, so a peer thread already
  // inside an NCCL call does not touch freed memory, and nothing waits here: ncclCommAbort
  // (older NCCL) frees them, and since NCCL 2.26 waits for every CUDA graph that captured
  // them to be destroyed first — graphs the failing rank's own model still holds.
  const RevokeFn revoke = revokeFunction();
  group_->freed = revoke == nullptr;
  for (ncclComm_t c : group_->comms) {
    if (c == nullptr) continue;
    if (revoke != nullptr) {
      revoke(c, 0);
    } else {
      ncclCommAbort(c);
    }
  }
  CLEAVE_LOG(ERROR) << "tensor-parallel group aborted: a rank could not finish its step";
}

absl::Status NcclCommunicator::orderP2p(cudaStream_t stream) {
  if (p2p_stream_ != nullptr && p2p_stream_ != stream) {
    // The device, not the old stream: that one may be gone by now.
    if (absl::Status s = cuda::cudaStatus(cudaDeviceSynchronize(), "p2p all-reduce"); !s.ok())
      return s;
  }
  p2p_stream_ = stream;
  return absl::OkStatus();
}

absl::Status NcclCommunicator::enqueueAllReduceBf16(void* data, int64_t count,
                                                    cudaStream_t stream) {
  if (absl::Status s = usable(); !s.ok()) return s;
  if (p2p_ != nullptr && count * 2 <= p2p_->maxBytes()) {
    if (absl::Status s = orderP2p(stream); !s.ok()) return s;
    return p2p_->run(rank_, data, count, cuda::P2pAllReduce::Dtype::kBf16, stream);
  }
  return ncclStatus(ncclAllReduce(data, data, static_cast<size_t>(count), ncclBfloat16, ncclSum,
                                  static_cast<ncclComm_t>(comm_), stream),
                    "bf16 all-reduce");
}

absl::Status NcclCommunicator::enqueueAllReduceF32(float* data, int64_t count,
                                                   cudaStream_t stream) {
  if (absl::Status s = usable(); !s.ok()) return s;
  return ncclStatus(ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat, ncclSum,
                                  static_cast<ncclComm_t>(comm_), stream),
                    "f32 all-reduce");
}

absl::Status NcclCommunicator::enqueueAllGather(const float* in, std::span<const int64_t> counts,
                                                float* out, cudaStream_t stream) {
  if (absl::Status s = usable(); !s.ok()) return s;
  if (static_cast<int>(counts.size()) != size_)
    return absl::InvalidArgumentError("all-gather: counts do not match the group");
  // Uneven counts: one broadcast per rank into its place, grouped into one launch.
  ncclComm_t comm = static_cast<ncclComm_t>(comm_);
  if (absl::Status s = ncclStatus(ncclGroupStart(), "group start"); !s.ok()) return s;
  int64_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    const float* send = r == rank_ ? in : nullptr;
    ncclResult_t result = ncclBroadcast(send, out + offset, counts[r], ncclFloat, r, comm, stream);
    if (result != ncclSuccess) {
      ncclGroupEnd();
      return ncclStatus(result, "all-gather");
    }
    offset += counts[r];
  }
  return ncclStatus(ncclGroupEnd(), "group end");
}

absl::Status NcclCommunicator::allGather(std::span<const float> in, std::span<const int64_t> counts,
                                         std::span<float> out) {
  if (static_cast<int>(counts.size()) != size_ || static_cast<int64_t>(in.size()) != counts[rank_])
    return absl::InvalidArgumentError("all-gather: counts do not match the group");
  if (absl::Status s = cuda::cudaStatus(cudaSetDevice(device_), "selecting a GPU"); !s.ok())
    return s;
  if (absl::Status s = enqueueAllGather(in.data(), counts, out.data(), stream_); !s.ok()) return s;
  return finish("all-gather");
}

absl::Status NcclCommunicator::broadcast(std::span<std::byte> data, int root) {
  if (absl::Status s = usable(); !s.ok()) return s;
  if (absl::Status s = cuda::cudaStatus(cudaSetDevice(device_), "selecting a GPU"); !s.ok())
    return s;
  if (absl::Status s = ncclStatus(ncclBroadcast(data.data(), data.data(), data.size(), ncclUint8,
                                                root, static_cast<ncclComm_t>(comm_), stream_),
                                  "broadcast");
      !s.ok())
    return s;
  return finish("broadcast");
}

absl::Status NcclCommunicator::barrier() { return allReduceSum({scratch_, 1}); }

}  // namespace cleave::engine
