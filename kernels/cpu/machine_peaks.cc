#include "kernels/cpu/machine_peaks.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/huge_pages.h"

namespace cleave::cpu {
namespace {

constexpr int64_t kIterations = 1 << 22;

// 12 independent accumulator chains hide the instruction latency.
__attribute__((target("avx512f,avx512vnni"))) float vnniLoop(int64_t iterations) {
  __m512i acc[12];
  for (auto& a : acc) a = _mm512_setzero_si512();
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  for (int64_t i = 0; i < iterations; ++i) {
    for (auto& a : acc) a = _mm512_dpbusd_epi32(a, u, s);
  }
  __m512i sum = acc[0];
  for (int k = 1; k < 12; ++k) sum = _mm512_add_epi32(sum, acc[k]);
  return static_cast<float>(_mm512_reduce_add_epi32(sum));
}

// The AVX2 form the quantized kernels issue: VPMADDUBSW (32 u8 x s8 products summed in pairs)
// into int16 accumulators (VPADDW). Each product takes its accumulator as the unsigned operand,
// so none is the same from one iteration to the next (a product of constants would be hoisted).
__attribute__((target("avx2"))) float maddubsLoop(int64_t iterations) {
  __m256i acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm256_set1_epi8(static_cast<char>(k));
  const __m256i s = _mm256_set1_epi8(-2);
  for (int64_t i = 0; i < iterations; ++i) {
    for (auto& a : acc) a = _mm256_add_epi16(a, _mm256_maddubs_epi16(a, s));
  }
  __m256i sum = acc[0];
  for (int k = 1; k < 12; ++k) sum = _mm256_add_epi16(sum, acc[k]);
  return static_cast<float>(_mm256_extract_epi16(sum, 0));
}

__attribute__((target("avx512f"))) float fmaLoop512(int64_t iterations) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_set1_ps(1.0f);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
    for (auto& a : acc) a = _mm512_fmadd_ps(a, m, c);
  }
  __m512 sum = acc[0];
  for (int k = 1; k < 12; ++k) sum = _mm512_add_ps(sum, acc[k]);
  return _mm512_reduce_add_ps(sum);
}

// As the kernel issues them: one VDPBF16PS per accumulator, 12 chains to hide the latency.
__attribute__((target("avx512f,avx512bf16"))) float bf16DotLoop(int64_t iterations) {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_set1_ps(1.0f);
  const __m512bh m = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.5f));
  for (int64_t i = 0; i < iterations; ++i) {
    for (auto& a : acc) a = _mm512_dpbf16_ps(a, m, m);
  }
  __m512 sum = acc[0];
  for (int k = 1; k < 12; ++k) sum = _mm512_add_ps(sum, acc[k]);
  return _mm512_reduce_add_ps(sum);
}

__attribute__((target("avx2,fma"))) float fmaLoop256(int64_t iterations) {
  __m256 acc[12];
  for (auto& a : acc) a = _mm256_set1_ps(1.0f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
    for (auto& a : acc) a = _mm256_fmadd_ps(a, m, c);
  }
  float out[8];
  __m256 sum = acc[0];
  for (int k = 1; k < 12; ++k) sum = _mm256_add_ps(sum, acc[k]);
  _mm256_storeu_ps(out, sum);
  return out[0];
}

// Runs `loop` on every thread of the pool at once; ops = per-iteration ops of one thread.
// The best of three runs: a thread the OS did not schedule at once only makes a run slower.
double measure(ThreadPool& pool, float (*loop)(int64_t), double ops_per_iteration) {
  std::atomic<float> sink{0};
  loop(kIterations / 16);  // Wake the units up.
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto start = std::chrono::steady_clock::now();
    pool.run(pool.size(), [&](int64_t) { sink = sink + loop(kIterations); });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, pool.size() * kIterations * ops_per_iteration / seconds);
  }
  return best;
}

}  // namespace

double int8PeakOps(ThreadPool& pool) {
  if (bestIsa() == Isa::kAvx512) return measure(pool, vnniLoop, 12 * 64 * 2.0);
  if (bestIsa() == Isa::kAvx2) return measure(pool, maddubsLoop, 12 * 32 * 2.0);
  return 0;
}

double f32PeakFlops(ThreadPool& pool) {
  if (cpuFeatures().avx512f) return measure(pool, fmaLoop512, 12 * 16 * 2.0);
  return measure(pool, fmaLoop256, 12 * 8 * 2.0);
}

double bf16PeakFlops(ThreadPool& pool) {
  if (bestIsa() != Isa::kAvx512 || !cpuFeatures().avx512bf16) return 0;
  return measure(pool, bf16DotLoop, 12 * 16 * 2 * 2.0);
}

double readBandwidth(ThreadPool& pool, int reps, int64_t bytes) {
  // The memory the streams it bounds read: the KV cache and repacked weights (huge_pages.h).
  const std::shared_ptr<uint8_t> memory = allocateOnHugePages(std::max<int64_t>(bytes / 8, 1) * 8);
  if (memory == nullptr) std::abort();
  std::span<uint64_t> buffer(reinterpret_cast<uint64_t*>(memory.get()),
                             static_cast<size_t>(std::max<int64_t>(bytes / 8, 1)));
  std::fill(buffer.begin(), buffer.end(), uint64_t{1});
  std::vector<double> rates;
  for (int r = 0; r < std::max(reps, 1); ++r) {
    std::vector<uint64_t> partial(pool.size() * 8);
    auto start = std::chrono::steady_clock::now();
    pool.parallelFor(static_cast<int64_t>(buffer.size()), 4096, [&](int64_t b, int64_t e) {
      partial[(b * pool.size() / buffer.size()) * 8] +=
          std::accumulate(buffer.begin() + b, buffer.begin() + e, uint64_t{0});
    });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (std::accumulate(partial.begin(), partial.end(), uint64_t{0}) != buffer.size()) std::abort();
    rates.push_back(buffer.size() * 8.0 / s);
  }
  // The best pass: what the memory can deliver (another process only ever slows a pass),
  // as the arithmetic peaks take their best; a floor from a slowed pass is no floor.
  return *std::max_element(rates.begin(), rates.end());
}

}  // namespace cleave::cpu
