#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cfloat>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sampling.h"

namespace cleave::cuda {
namespace {

constexpr int kThreads = 512;
using Reduce = cub::BlockReduce<float, kThreads>;
using CountReduce = cub::BlockReduce<int, kThreads>;
using Scan = cub::BlockScan<float, kThreads>;

struct Shared {
  union {
    Reduce::TempStorage reduce;
    CountReduce::TempStorage count;
    Scan::TempStorage scan;
  };
  float value;
  int count_value;
  int token;
  int fallback;
};

// Float order as unsigned order (so a threshold can be searched bit by bit).
__device__ __forceinline__ uint32_t orderKey(float x) {
  const uint32_t bits = __float_as_uint(x);
  return bits & 0x80000000u ? ~bits : bits | 0x80000000u;
}
__device__ __forceinline__ float fromKey(uint32_t key) {
  return __uint_as_float(key & 0x80000000u ? key & 0x7fffffffu : ~key);
}

__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Thread 0's `value` (where a block reduction leaves its result) for every thread.
template <typename T>
__device__ T broadcast(T value, T& slot) {
  if (threadIdx.x == 0) slot = value;
  __syncthreads();
  const T result = slot;
  __syncthreads();
  return result;
}
__device__ float blockMax(float v, Shared& s) {
  return broadcast(Reduce(s.reduce).Reduce(v, [](float a, float b) { return fmaxf(a, b); }),
                   s.value);
}
__device__ float blockSum(float v, Shared& s) {
  return broadcast(Reduce(s.reduce).Sum(v), s.value);
}
__device__ int blockCount(int v, Shared& s) {
  return broadcast(CountReduce(s.count).Sum(v), s.count_value);
}

// One block per row.
__global__ void __launch_bounds__(kThreads)
    sampleKernel(const float* logits, int64_t stride, int vocab, const SamplingRow* params,
                 int32_t* ids) {
  __shared__ Shared s;
  const float* row = logits + blockIdx.x * stride;
  const SamplingRow p = params[blockIdx.x];

  float local_max = -FLT_MAX;
  int local_index = 0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    if (row[i] > local_max) {
      local_max = row[i];
      local_index = i;
    }
  }
  const float top = blockMax(local_max, s);
  // The lowest index holding the maximum: the greedy token and the fallback draw.
  if (threadIdx.x == 0) s.token = vocab;
  __syncthreads();
  if (local_max == top) atomicMin(&s.token, local_index);
  __syncthreads();
  const int argmax = s.token;
  if (p.temperature <= 0.0f) {
    if (threadIdx.x == 0) ids[blockIdx.x] = argmax;
    return;
  }
  const float inv_t = fminf(1.0f / p.temperature, FLT_MAX);  // A tiny temperature: no inf.
  auto weight = [&](float x) { return __expf((x - top) * inv_t); };

  // Keep x >= threshold. top_k: the k-th largest value, found bit by bit on its key.
  float threshold = -FLT_MAX;
  if (p.top_k > 0 && p.top_k < vocab) {
    uint32_t key = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t candidate = key | (1u << bit);
      int count = 0;
      for (int i = threadIdx.x; i < vocab; i += kThreads)  // NaN is no candidate.
        count += !isnan(row[i]) && orderKey(row[i]) >= candidate;
      if (blockCount(count, s) >= p.top_k) key = candidate;
    }
    threshold = fromKey(key);
  }
  // top_p over what top_k kept: the largest value whose kept-and-above mass reaches top_p.
  if (p.top_p < 1.0f) {
    float mass = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += kThreads)
      if (row[i] >= threshold) mass += weight(row[i]);
    const float wanted = p.top_p * blockSum(mass, s);
    // Candidates at or below the top_k threshold hold the whole kept mass, so the search
    // from 0 ends at or above it.
    uint32_t key = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t candidate = key | (1u << bit);
      if (isnan(fromKey(candidate))) continue;  // Above +inf: nothing is kept there.
      const float bound = fmaxf(threshold, fromKey(candidate));
      float above = 0.0f;
      for (int i = threadIdx.x; i < vocab; i += kThreads)
        if (row[i] >= bound) above += weight(row[i]);
      if (blockSum(above, s) >= wanted) key = candidate;
    }
    threshold = fmaxf(threshold, fromKey(key));
  }
  if (p.min_p > 0.0f) threshold = fmaxf(threshold, top + p.temperature * __logf(p.min_p));

  // Draw: each thread owns a contiguous run of the vocabulary; the scan of their masses
  // says whose run holds the draw.
  const int run = (vocab + kThreads - 1) / kThreads;
  const int begin = min(vocab, static_cast<int>(threadIdx.x) * run);
  const int end = min(vocab, begin + run);
  float mine = 0.0f;
  for (int i = begin; i < end; ++i)
    if (row[i] >= threshold) mine += weight(row[i]);
  float before = 0.0f, total = 0.0f;
  Scan(s.scan).ExclusiveSum(mine, before, total);
  __syncthreads();
  const uint64_t bits = mix(p.seed ^ mix(p.index));
  const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f) * total;
  if (threadIdx.x == 0) {
    s.token = vocab;
    s.fallback = -1;
  }
  __syncthreads();
  if (u >= before && u < before + mine) {
    float running = before;
    int chosen = -1;
    for (int i = begin; i < end && chosen < 0; ++i) {
      if (!(row[i] >= threshold)) continue;  // As every other pass: NaN is never kept.
      running += weight(row[i]);
      if (u < running) chosen = i;
    }
    if (chosen >= 0) atomicMin(&s.token, chosen);
  }
  __syncthreads();
  // The scan's sums and a thread's own running sum round differently, so a draw can fall in
  // a sliver no run claims: it then takes the last kept token at or below it.
  if (s.token == vocab) {  // The same for every thread: read after the barrier.
    if (mine > 0.0f && u >= before) {
      int last_kept = -1;
      for (int i = begin; i < end; ++i)
        if (row[i] >= threshold) last_kept = i;
      atomicMax(&s.fallback, last_kept);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int drawn = s.token < vocab ? s.token : s.fallback;
    ids[blockIdx.x] = drawn >= 0 ? drawn : argmax;
  }
}

// One block per row.
__global__ void penaltiesKernel(float* logits, int64_t stride, int vocab,
                                const PenaltyRow* penalties, const SeenToken* seen) {
  const PenaltyRow p = penalties[blockIdx.x];
  float* row = logits + blockIdx.x * stride;
  for (int i = threadIdx.x; i < p.size; i += blockDim.x) {
    const SeenToken t = seen[p.begin + i];
    if (t.token < 0 || t.token >= vocab) continue;
    float x = row[t.token];
    if (p.repetition != 1.0f)
      x = x > 0.0f ? __fdiv_rn(x, p.repetition) : __fmul_rn(x, p.repetition);
    if (t.count > 0)
      x = __fsub_rn(x, __fadd_rn(p.presence, __fmul_rn(p.frequency, static_cast<float>(t.count))));
    row[t.token] = x;
  }
}

constexpr int kLogprobThreads = 256;

// One block per row.
__global__ void __launch_bounds__(kLogprobThreads)
    logprobsKernel(const float* logits, int64_t stride, int vocab, const int32_t* counts,
                   const int32_t* ids, float* chosen, TokenLogprob* top, int64_t max_top) {
  using MaxReduce = cub::BlockReduce<float, kLogprobThreads>;
  using PairReduce = cub::BlockReduce<cub::KeyValuePair<int, float>, kLogprobThreads>;
  __shared__ union {
    typename MaxReduce::TempStorage reduce;
    typename PairReduce::TempStorage pair;
  } temp;
  __shared__ float shared_value;
  __shared__ cub::KeyValuePair<int, float> shared_pair;
  const int n = counts[blockIdx.x];
  if (n < 0) return;
  const float* row = logits + blockIdx.x * stride;
  float local = -FLT_MAX;
  for (int i = threadIdx.x; i < vocab; i += kLogprobThreads) local = fmaxf(local, row[i]);
  const float top_value =
      MaxReduce(temp.reduce).Reduce(local, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) shared_value = top_value;
  __syncthreads();
  const float peak = shared_value;
  __syncthreads();
  float sum = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += kLogprobThreads) sum += __expf(row[i] - peak);
  const float total = MaxReduce(temp.reduce).Sum(sum);
  if (threadIdx.x == 0) shared_value = peak + logf(total);
  __syncthreads();
  const float log_total = shared_value;  // log sum exp
  if (threadIdx.x == 0) chosen[blockIdx.x] = row[ids[blockIdx.x]] - log_total;
  // The n best in (value descending, token ascending) order, one block-wide pass each.
  auto better = [](const cub::KeyValuePair<int, float>& a, const cub::KeyValuePair<int, float>& b) {
    if (a.key < 0) return b;
    if (b.key < 0) return a;
    return a.value > b.value || (a.value == b.value && a.key < b.key) ? a : b;
  };
  cub::KeyValuePair<int, float> previous(-1, FLT_MAX);
  for (int k = 0; k < n && k < max_top && k < vocab; ++k) {
    cub::KeyValuePair<int, float> best(-1, -FLT_MAX);
    for (int i = threadIdx.x; i < vocab; i += kLogprobThreads) {
      const float v = row[i];
      if (!isfinite(v)) continue;  // NaN, masked (-inf) and +inf ones: no alternative, as the CPU.
      // Only candidates after the previous one in the order.
      const bool after =
          previous.key < 0 || v < previous.value || (v == previous.value && i > previous.key);
      if (after) best = better(best, cub::KeyValuePair<int, float>(i, v));
    }
    const cub::KeyValuePair<int, float> winner = PairReduce(temp.pair).Reduce(best, better);
    if (threadIdx.x == 0) shared_pair = winner;
    __syncthreads();
    previous = shared_pair;
    __syncthreads();
    if (previous.key < 0) {  // Nothing left (a row of NaN): token -1 in the rest.
      if (threadIdx.x == 0)
        for (int rest = k; rest < n && rest < max_top; ++rest)
          top[blockIdx.x * max_top + rest] = {.token = -1, .logprob = __int_as_float(0x7fc00000)};
      break;
    }
    if (threadIdx.x == 0)
      top[blockIdx.x * max_top + k] = {.token = previous.key,
                                       .logprob = previous.value - log_total};
  }
}

}  // namespace

absl::Status logSoftmaxAt(const float* logits, int64_t stride, int64_t rows, int64_t vocab,
                          const int32_t* counts, const int32_t* ids, float* chosen,
                          TokenLogprob* top, int64_t max_top, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  if (vocab < 1 || vocab > INT32_MAX)
    return absl::InvalidArgumentError("logSoftmaxAt: vocab must be in [1, 2^31)");
  logprobsKernel<<<static_cast<unsigned>(rows), kLogprobThreads, 0, stream>>>(
      logits, stride, static_cast<int>(vocab), counts, ids, chosen, top, max_top);
  return launchStatus("log-softmax");
}

absl::Status applyPenalties(float* logits, int64_t stride, int64_t rows, int64_t vocab,
                            const PenaltyRow* penalties, const SeenToken* seen,
                            cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  if (vocab < 1 || vocab > INT32_MAX)
    return absl::InvalidArgumentError("applyPenalties: vocab must be in [1, 2^31)");
  penaltiesKernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(
      logits, stride, static_cast<int>(vocab), penalties, seen);
  return launchStatus("apply penalties");
}

absl::Status sampleTokens(const float* logits, int64_t stride, int64_t rows, int64_t vocab,
                          const SamplingRow* params, int32_t* ids, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  if (vocab < 1 || vocab > INT32_MAX)
    return absl::InvalidArgumentError("sample: vocab must be in [1, 2^31)");
  sampleKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, stride, static_cast<int>(vocab), params, ids);
  return launchStatus("sample");
}

}  // namespace cleave::cuda
