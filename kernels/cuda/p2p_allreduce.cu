#include "kernels/cuda/p2p_allreduce.h"

#include <cuda_bf16.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace cleave::cuda {
namespace {

constexpr int kBlocks = 16;
constexpr int kThreads = 512;

// Every rank's inbox and flags, as a table in each rank's device memory.
struct PeerTable {
  uint8_t* inbox[P2pAllReduce::kMaxRanks];
  uint32_t* flags[P2pAllReduce::kMaxRanks];
};

struct Args {
  void* data;
  int64_t count;
  int64_t slot;  // elements per inbox slot
  int rank;
  int ranks;
  const PeerTable* peers;
  uint32_t* counters;
  const volatile uint32_t* aborted;  // host memory, mapped
};

__device__ __forceinline__ void storeRelease(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t loadAcquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ float toFloat(float v) { return v; }
__device__ __forceinline__ float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T fromFloat(float v);
template <>
__device__ __forceinline__ float fromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) oneShotKernel(Args a) {
  T* data = static_cast<T*>(a.data);
  const int b = blockIdx.x;
  // Counts fit in int: at most max_bytes / 2 elements.
  const int count = static_cast<int>(a.count);
  const int chunk = (count + kBlocks - 1) / kBlocks;
  const int begin = b * chunk;
  const int end = begin + chunk < count ? begin + chunk : count;
  __shared__ uint32_t call;
  if (threadIdx.x == 0) call = a.counters[b] + 1;
  __syncthreads();
  const int64_t half = static_cast<int64_t>(call & 1u) * a.ranks * a.slot;
  // Push this block's chunk into slot `rank` of every rank's inbox.
  for (int p = 0; p < a.ranks; ++p) {
    T* dst = reinterpret_cast<T*>(a.peers->inbox[p]) + half + a.rank * a.slot;
    for (int i = begin + threadIdx.x; i < end; i += kThreads) dst[i] = data[i];
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x < a.ranks) storeRelease(a.peers->flags[threadIdx.x] + a.rank * kBlocks + b, call);
  // Wait for every peer's chunk (a peer may already be one call ahead: >=).
  if (threadIdx.x < a.ranks) {
    const uint32_t* flag = a.peers->flags[a.rank] + threadIdx.x * kBlocks + b;
    // The abort flag is host memory (a PCIe round trip): looked at every 1024 polls.
    for (uint32_t polls = 1; static_cast<int32_t>(loadAcquire(flag) - call) < 0; ++polls) {
      if ((polls & 1023u) == 0 && *a.aborted) break;
    }
  }
  __syncthreads();
  const T* mine = reinterpret_cast<const T*>(a.peers->inbox[a.rank]) + half;
  for (int i = begin + threadIdx.x; i < end; i += kThreads) {
    float sum = 0.0f;
    for (int q = 0; q < a.ranks; ++q) sum += toFloat(mine[q * a.slot + i]);
    data[i] = fromFloat<T>(sum);
  }
  if (threadIdx.x == 0) a.counters[b] = call;
}

}  // namespace

absl::StatusOr<std::unique_ptr<P2pAllReduce>> P2pAllReduce::create(const std::vector<int>& devices,
                                                                   int64_t max_bytes) {
  const int n = static_cast<int>(devices.size());
  if (n < 1 || n > kMaxRanks)
    return absl::InvalidArgumentError(absl::StrCat("p2p all-reduce: ", n, " ranks (1 to 8)"));
  if (max_bytes <= 0 || max_bytes % 16 != 0)
    return absl::InvalidArgumentError(
        "p2p all-reduce: max_bytes must be a positive multiple of 16");
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      int can = 0;
      if (absl::Status s = cudaStatus(cudaDeviceCanAccessPeer(&can, devices[i], devices[j]),
                                      "checking peer access");
          !s.ok())
        return s;
      if (!can) {
        return absl::FailedPreconditionError(absl::StrCat("GPU ", devices[i], " cannot reach GPU ",
                                                          devices[j], " over peer-to-peer"));
      }
    }
  }
  std::unique_ptr<P2pAllReduce> p(new P2pAllReduce());
  p->devices_ = devices;
  p->max_bytes_ = max_bytes;
  for (int i = 0; i < n; ++i) {
    if (absl::Status s = cudaStatus(cudaSetDevice(devices[i]), "selecting a GPU"); !s.ok())
      return s;
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(devices[j], 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // Already on (another group): fine.
      } else if (absl::Status s = cudaStatus(e, "enabling peer access"); !s.ok()) {
        return s;
      }
    }
    uint8_t* inbox = nullptr;
    uint32_t* flags = nullptr;
    uint32_t* counters = nullptr;
    const size_t inbox_bytes = 2 * static_cast<size_t>(n) * max_bytes;
    for (auto [ptr, bytes] :
         {std::pair<void**, size_t>{reinterpret_cast<void**>(&inbox), inbox_bytes},
          {reinterpret_cast<void**>(&flags), sizeof(uint32_t) * n * kBlocks},
          {reinterpret_cast<void**>(&counters), sizeof(uint32_t) * kBlocks}}) {
      if (absl::Status s = cudaStatus(cudaMalloc(ptr, bytes), "p2p all-reduce buffers"); !s.ok())
        return s;
      if (absl::Status s = cudaStatus(cudaMemset(*ptr, 0, bytes), "p2p all-reduce buffers");
          !s.ok())
        return s;
    }
    p->inbox_.push_back(inbox);
    p->flags_.push_back(flags);
    p->counters_.push_back(counters);
  }
  if (absl::Status s =
          cudaStatus(cudaHostAlloc(reinterpret_cast<void**>(&p->abort_host_), sizeof(uint32_t),
                                   cudaHostAllocMapped | cudaHostAllocPortable),
                     "p2p abort flag");
      !s.ok())
    return s;
  *p->abort_host_ = 0;
  if (absl::Status s = cudaStatus(
          cudaHostGetDevicePointer(reinterpret_cast<void**>(&p->abort_device_), p->abort_host_, 0),
          "p2p abort flag");
      !s.ok())
    return s;
  PeerTable table{};
  for (int i = 0; i < n; ++i) {
    table.inbox[i] = p->inbox_[i];
    table.flags[i] = p->flags_[i];
  }
  for (int i = 0; i < n; ++i) {
    void* t = nullptr;
    if (absl::Status s = cudaStatus(cudaSetDevice(devices[i]), "selecting a GPU"); !s.ok())
      return s;
    if (absl::Status s = cudaStatus(cudaMalloc(&t, sizeof(PeerTable)), "p2p peer table"); !s.ok())
      return s;
    p->tables_.push_back(t);
    if (absl::Status s = cudaStatus(cudaMemcpy(t, &table, sizeof(table), cudaMemcpyHostToDevice),
                                    "p2p peer table");
        !s.ok())
      return s;
  }
  return p;
}

void P2pAllReduce::abort() const {
  if (abort_host_ != nullptr) *reinterpret_cast<volatile uint32_t*>(abort_host_) = 1;
}

P2pAllReduce::~P2pAllReduce() {
  if (abort_host_ != nullptr) cudaFreeHost(abort_host_);
  for (size_t i = 0; i < devices_.size(); ++i) {
    cudaSetDevice(devices_[i]);
    if (i < inbox_.size()) cudaFree(inbox_[i]);
    if (i < flags_.size()) cudaFree(flags_[i]);
    if (i < counters_.size()) cudaFree(counters_[i]);
    if (i < tables_.size()) cudaFree(tables_[i]);
  }
}

absl::Status P2pAllReduce::run(int rank, void* data, int64_t count, Dtype dtype,
                               cudaStream_t stream) const {
  const int64_t element = dtype == Dtype::kF32 ? 4 : 2;
  if (rank < 0 || rank >= ranks())
    return absl::InvalidArgumentError(absl::StrCat("p2p all-reduce: rank ", rank));
  if (count < 0 || count * element > max_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("p2p all-reduce: ", count * element,
                                                   " bytes, more than the ", max_bytes_,
                                                   " it was made for"));
  }
  if (*reinterpret_cast<volatile uint32_t*>(abort_host_) != 0)
    return absl::FailedPreconditionError("p2p all-reduce: the group was aborted");
  if (count == 0) return absl::OkStatus();
  const Args a{.data = data,
               .count = count,
               .slot = max_bytes_ / element,
               .rank = rank,
               .ranks = ranks(),
               .peers = static_cast<const PeerTable*>(tables_[rank]),
               .counters = counters_[rank],
               .aborted = abort_device_};
  if (dtype == Dtype::kF32) {
    oneShotKernel<float><<<kBlocks, kThreads, 0, stream>>>(a);
  } else {
    oneShotKernel<__nv_bfloat16><<<kBlocks, kThreads, 0, stream>>>(a);
  }
  return launchStatus("p2p all-reduce");
}

}  // namespace cleave::cuda
