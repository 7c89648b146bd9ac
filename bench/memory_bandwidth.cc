// Memory bandwidth of this machine: the denominator of every CPU roofline floor.
//
// Reads (a sum over 64-bit words) and copies (memcpy) a buffer much larger than the caches
// and reports bytes per second as Google Benchmark counters. Copy counts bytes read plus
// bytes written. Run: build/default/bin/bench_memory_bandwidth --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace {

constexpr size_t kBytes = size_t{1} << 30;  // 1 GiB: far past any last-level cache.

std::vector<uint64_t>& source() {
  static std::vector<uint64_t> buffer = [] {
    std::vector<uint64_t> b(kBytes / sizeof(uint64_t));
    std::mt19937_64 rng(42);
    for (auto& word : b) word = rng();  // Random, so no page is a shared zero page.
    return b;
  }();
  return buffer;
}

// Sums `words` with `threads` threads, each over its own slice.
uint64_t parallelSum(const std::vector<uint64_t>& words, int threads) {
  std::vector<uint64_t> partial(threads);
  std::vector<std::thread> workers;
  size_t slice = words.size() / threads;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const uint64_t* begin = words.data() + t * slice;
      partial[t] = std::accumulate(begin, begin + slice, uint64_t{0});
    });
  }
  for (auto& w : workers) w.join();
  return std::accumulate(partial.begin(), partial.end(), uint64_t{0});
}

void BM_Read(benchmark::State& state) {
  const auto& words = source();
  int threads = static_cast<int>(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(parallelSum(words, threads));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kBytes);
}

void BM_Copy(benchmark::State& state) {
  const auto& words = source();
  std::vector<uint64_t> destination(words.size(), 1);
  for (auto _ : state) {
    std::memcpy(destination.data(), words.data(), kBytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * kBytes);
}

BENCHMARK(BM_Read)
    ->Arg(1)
    ->Arg(static_cast<int>(std::thread::hardware_concurrency()))
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Copy)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
