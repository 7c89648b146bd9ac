// Quantized matrix products at the shapes of a small model's decode step, against the
// memory floor. A decode matmul must stream the whole weight matrix once per step, so its
// floor is weight bytes / memory bandwidth; the bandwidth is measured in the same run
// (BM_StreamRead, a sum over a 1 GiB buffer with the same threads).
//
// Run: build/default/bin/bench_matmul --benchmark_repetitions=5 --benchmark_report_aggregates_only
// Counters: weight_GBps (weight bytes / time); compare with BM_StreamRead's read_GBps.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "bench/bench_pool.h"
#include "common/model/dequant_kernels.h"
#include "kernels/cpu/machine_peaks.h"
#include "kernels/cpu/matmul.h"

namespace {

using cleave::cpu::ThreadPool;
namespace bench = cleave::bench;
using cleave::model::TensorType;

using bench::pool;

// The read bandwidth bench_engine and a worker's floors use (cpu::readBandwidth: a 1 GiB
// buffer on the huge pages the repacked weights live on, the best of three passes).
void BM_StreamRead(benchmark::State& state) {
  double best = 0;
  for (auto _ : state) best = std::max(best, cleave::cpu::readBandwidth(pool(), 3));
  state.counters["read_GBps"] = best / 1e9;
}

// Args: rows, cols, tokens, type.
void BM_Matmul(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), tokens = state.range(2);
  const auto type = static_cast<TensorType>(state.range(3));
  // Several copies so one step's weights do not stay in cache between iterations.
  const int copies = 8;
  std::mt19937 rng(7);
  const int64_t bytes = rows * *cleave::model::tensorBytes(type, cols);
  std::vector<uint8_t> source(bytes);
  for (auto& b : source) b = static_cast<uint8_t>(rng() & 0x3f);  // Small, finite f16 scales.
  // Float weights as trained ones are: normal numbers around 0.02 (random bytes would hold
  // subnormals, whose products take a slow path that real weights never do).
  std::normal_distribution<float> weight(0.0f, 0.02f);
  for (int64_t at = 0; at < rows * cols; ++at) {
    const float v = weight(rng);
    if (type == TensorType::kF32) std::memcpy(source.data() + 4 * at, &v, 4);
    if (type == TensorType::kF16 || type == TensorType::kBF16) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const uint16_t h = type == TensorType::kF16 ? cleave::model::dequant::floatToHalf(v)
                                                  : static_cast<uint16_t>(bits >> 16);
      std::memcpy(source.data() + 2 * at, &h, 2);
    }
  }
  if (type == TensorType::kMXFP4) {  // Exponents as trained weights have them (no subnormals).
    for (int64_t at = 0; at < bytes; at += 17) source[at] = static_cast<uint8_t>(118 + rng() % 8);
  }
  // E2M1 and FP8 take block scales: here one per 16 elements of a row, as NVFP4 checkpoints
  // have them.
  const bool scaled = type == TensorType::kE2M1 || type == TensorType::kF8E4M3;
  std::vector<float> scales(scaled ? rows * ((cols + 15) / 16) : 0, 0.5f);
  const cleave::cpu::BlockScales block_scales{
      .data = scales.data(), .block_rows = 1, .block_cols = 16, .cols = (cols + 15) / 16};
  std::vector<cleave::cpu::CpuMatrix> weights;
  for (int c = 0; c < copies; ++c) {
    auto m = cleave::cpu::CpuMatrix::create(
        {.type = type,
         .rows = rows,
         .cols = cols,
         .data = source.data(),
         .scales = scaled ? block_scales : cleave::cpu::BlockScales{}});
    if (!m.ok()) {
      state.SkipWithError("unsupported weight");
      return;
    }
    weights.push_back(std::move(*m));
  }
  std::vector<float> x(tokens * cols), y(tokens * rows);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  int i = 0;
  for (auto _ : state) {
    const cleave::cpu::CpuMatrix& w = weights[i++ % copies];
    auto status = cleave::cpu::matmul(
        {.weight = &w, .x = x.data(), .ldx = cols, .tokens = tokens, .y = y.data(), .ldy = rows},
        pool());
    if (!status.ok()) state.SkipWithError("matmul failed");
  }
  state.counters["weight_GBps"] =
      benchmark::Counter(static_cast<double>(weights[0].bytes()) * state.iterations() / 1e9,
                         benchmark::Counter::kIsRate);
  state.counters["tokens"] = static_cast<double>(tokens);
}

BENCHMARK(BM_StreamRead)->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(1);
// A SmolLM2-135M layer (hidden 576, intermediate 1536) and its Q8_0 output head.
BENCHMARK(BM_Matmul)
    ->ArgsProduct({{1536}, {576}, {1, 4, 16, 64, 512}, {static_cast<int>(TensorType::kQ4_1)}})
    ->ArgsProduct({{576}, {1536}, {1, 16, 512}, {static_cast<int>(TensorType::kQ4_1)}})
    ->ArgsProduct({{49152}, {576}, {1, 16}, {static_cast<int>(TensorType::kQ8_0)}})
    ->ArgsProduct({{4096}, {14336}, {1, 4, 16}, {static_cast<int>(TensorType::kQ6_K)}})
    // A gpt-oss expert's projection in the 4-bit formats: MXFP4, NVFP4 as GGUF stores it and
    // as safetensors checkpoints do (E2M1 codes, a float scale per 16), Q4_0; and Q8_0.
    ->ArgsProduct({{2880},
                   {2880},
                   {1, 4, 16},
                   {static_cast<int>(TensorType::kMXFP4), static_cast<int>(TensorType::kNVFP4),
                    static_cast<int>(TensorType::kE2M1), static_cast<int>(TensorType::kQ4_0),
                    static_cast<int>(TensorType::kQ8_0)}})
    // K-quants (what most GGUF files hold) against Q4_1 at a 2048-wide shape.
    ->ArgsProduct({{2048},
                   {2048},
                   {1, 16},
                   {static_cast<int>(TensorType::kQ4_1), static_cast<int>(TensorType::kQ4_K),
                    static_cast<int>(TensorType::kQ6_K)}})
    // Float weights as HF checkpoints hold them, at a 1024-wide model's shapes.
    ->ArgsProduct({{2048},
                   {1024},
                   {1, 16, 128},
                   {static_cast<int>(TensorType::kF32), static_cast<int>(TensorType::kBF16)}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
