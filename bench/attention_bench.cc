// The CPU attention kernels alone, at a small model's shapes (SmolLM2: 9 query heads on 3 KV
// heads, head_dim 64; and Llama-3-8B's 32 on 8, head_dim 128), blocks of 16, f32 caches and
// (decode) bf16 ones, a worker's default:
//   * decode: a batch of sequences, one new token each, over `context` cached positions;
//   * prefill: one chunk of `tokens` new tokens from position 0 (causal).
// Counters: flops_per_s (2 multiply-adds per query head, position and head dimension: QK and
// PV) and, for decode, kv_GBps (the K and V bytes read once per step). Compare with
// bench_engine's f32 peak and read bandwidth.
//
// Run: CLEAVE_THREADS=2 build/default/bin/bench_attention --benchmark_repetitions=5
//      --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "bench/bench_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/huge_pages.h"
#include "kernels/cpu/kv_format.h"

namespace {

using cleave::cpu::AttentionArgs;
using cleave::cpu::KvType;
using cleave::cpu::ThreadPool;
namespace bench = cleave::bench;

using bench::pool;

// `sequences` sequences of `new_tokens` tokens each ending at position `end - 1`, their
// blocks shuffled over the pool, the cache of `kv` elements.
void run(benchmark::State& state, int64_t heads, int64_t kv_heads, int64_t d, int64_t sequences,
         int64_t new_tokens, int64_t end, KvType kv = KvType::kF32) {
  const int64_t block = 16, per_sequence = (end + block - 1) / block;
  const int64_t blocks = sequences * per_sequence, tokens = sequences * new_tokens;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  // The pools on the pages a worker's KV cache uses (huge_pages.h).
  const int64_t elements = blocks * kv_heads * block * d;
  const int64_t element_bytes = cleave::cpu::kvElementBytes(kv);
  const auto k_memory = cleave::cpu::allocateOnHugePages(elements * element_bytes);
  const auto v_memory = cleave::cpu::allocateOnHugePages(elements * element_bytes);
  std::vector<float> values(elements);
  for (const auto& memory : {k_memory, v_memory}) {
    for (float& f : values) f = normal(rng);
    cleave::cpu::encodeKv(kv, values.data(), elements, 1.0f, memory.get());
  }
  std::vector<float> q(tokens * heads * d);
  for (float& f : q) f = normal(rng);
  std::vector<int32_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> positions;
  std::vector<const int32_t*> tables;
  for (int64_t s = 0; s < sequences; ++s) {
    for (int64_t i = 0; i < new_tokens; ++i) {
      positions.push_back(static_cast<int32_t>(end - new_tokens + i));
      tables.push_back(order.data() + s * per_sequence);
    }
  }
  std::vector<float> out(q.size());
  const AttentionArgs args{.q = q.data(),
                           .ldq = heads * d,
                           .tokens = tokens,
                           .positions = positions.data(),
                           .block_tables = tables.data(),
                           .k_pool = k_memory.get(),
                           .v_pool = v_memory.get(),
                           .kv_type = kv,
                           .block_size = block,
                           .heads = heads,
                           .kv_heads = kv_heads,
                           .head_dim = d,
                           .scale = 0.125f,
                           .out = out.data(),
                           .ldo = heads * d};
  for (auto _ : state) {
    cleave::cpu::attention(args, pool());
    benchmark::DoNotOptimize(out.data());
  }
  double attended = 0;
  for (int32_t p : positions) attended += p + 1;
  state.counters["flops_per_s"] =
      benchmark::Counter(4.0 * heads * d * attended, benchmark::Counter::kIsIterationInvariantRate);
  if (new_tokens == 1) {
    state.counters["kv_GBps"] =
        benchmark::Counter(2.0 * kv_heads * d * element_bytes * attended / 1e9,
                           benchmark::Counter::kIsIterationInvariantRate);
  }
}

// Args: sequences, positions, and the cache's KvType (0 f32, 1 bf16: a worker's default).
void BM_DecodeSmolLM2(benchmark::State& state) {
  run(state, 9, 3, 64, state.range(0), 1, state.range(1), static_cast<KvType>(state.range(2)));
}
void BM_DecodeLlama8B(benchmark::State& state) {
  run(state, 32, 8, 128, state.range(0), 1, state.range(1), static_cast<KvType>(state.range(2)));
}
void BM_PrefillSmolLM2(benchmark::State& state) {
  run(state, 9, 3, 64, 1, state.range(0), state.range(0));
}
void BM_PrefillLlama8B(benchmark::State& state) {
  run(state, 32, 8, 128, 1, state.range(0), state.range(0));
}

BENCHMARK(BM_DecodeSmolLM2)
    ->ArgsProduct({{16}, {1024, 4096}, {0, 1}})
    ->Args({64, 1024, 0})
    ->UseRealTime();
BENCHMARK(BM_DecodeLlama8B)->ArgsProduct({{16}, {1024}, {0, 1}})->Args({4, 4096, 0})->UseRealTime();
BENCHMARK(BM_PrefillSmolLM2)->Arg(512)->Arg(2048)->UseRealTime();
BENCHMARK(BM_PrefillLlama8B)->Arg(512)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
