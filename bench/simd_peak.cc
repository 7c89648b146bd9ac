#include "bench/simd_peak.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <vector>

#include "kernels/cpu/cpu_features.h"

namespace cleave::bench {
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
double measure(cpu::ThreadPool& pool, float (*loop)(int64_t), double ops_per_iteration) {
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

double int8PeakOps(cpu::ThreadPool& pool) {
  if (!cpu::cpuFeatures().avx512vnni) return 0;
  return measure(pool, vnniLoop, 12 * 64 * 2.0);
}

double f32PeakFlops(cpu::ThreadPool& pool) {
  if (cpu::cpuFeatures().avx512f) return measure(pool, fmaLoop512, 12 * 16 * 2.0);
  return measure(pool, fmaLoop256, 12 * 8 * 2.0);
}

}  // namespace cleave::bench
