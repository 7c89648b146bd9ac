// The CPU engine against its memory floor on a real model: prefill throughput at 128 and
// 512 tokens, and decode at batch 1, 4, 16 and 64 (each sequence holding 128 tokens of
// context). Every time is printed next to its floor: the bytes the step must read
// (weights once per step + the KV it attends over) divided by the read bandwidth measured
// in the same run with the same threads.
//
// With --tp N the model runs as a tensor-parallel group of N rank threads (threads split
// between them) sharing this machine's memory, so the floor is the same bytes over the same
// bandwidth.
//
// Run: build/default/bin/bench_engine [MODEL.gguf] [--threads N] [--reps R] [--tp N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "services/engine/kv_block_pool.h"
#include "services/engine/tp_group.h"

namespace {

using namespace cleave;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Read bandwidth in bytes/s: sum a 1 GiB buffer with every thread of the pool.
double measureBandwidth(cpu::ThreadPool& pool, int reps) {
  std::vector<uint64_t> buffer(size_t{1} << 27, 1);
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    std::vector<uint64_t> partial(pool.size() * 8);
    auto start = Clock::now();
    pool.parallelFor(static_cast<int64_t>(buffer.size()), 4096, [&](int64_t b, int64_t e) {
      partial[(b * pool.size() / buffer.size()) * 8] +=
          std::accumulate(buffer.begin() + b, buffer.begin() + e, uint64_t{0});
    });
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (std::accumulate(partial.begin(), partial.end(), uint64_t{0}) != buffer.size()) std::abort();
    rates.push_back(buffer.size() * 8.0 / s);
  }
  return median(rates);
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = std::string(CLEAVE_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int reps = 5;
  int tp = 1;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--tp") && i + 1 < argc)
      tp = std::atoi(argv[++i]);
    else
      path = argv[i];
  }
  auto group = engine::TpGroup::load(path, {.tp = tp, .threads = threads});
  if (!group.ok()) {
    std::fprintf(stderr, "bench_engine: %s\n", std::string(group.status().message()).c_str());
    return 1;
  }
  engine::TpGroup& model = **group;
  const model::ModelConfig& c = model.config();
  double bandwidth = 0;
  {
    cpu::ThreadPool pool(threads);
    bandwidth = measureBandwidth(pool, reps);
  }
  double weight_bytes = 0;
  for (int r = 0; r < tp; ++r) weight_bytes += static_cast<double>(model.weightBytes(r));
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  const double kv_bytes_per_token = 2.0 * c.num_layers * kv_dim * 4;  // f32 keys + values
  std::printf(
      "model %s: %.1f MB of weights read per step; %d threads, tp %d; measured read bandwidth "
      "%.1f GB/s\n",
      path.c_str(), weight_bytes / 1e6, threads, tp, bandwidth / 1e9);
  std::printf("%-22s %12s %12s %12s %10s\n", "case", "time (ms)", "tokens/s", "floor (ms)",
              "floor/time");

  const int64_t num_blocks = 64 * 16 + 40;
  if (!model.allocateKv(num_blocks, 16).ok()) return 1;
  engine::KvBlockPool cache({.block_size = 16, .num_blocks = num_blocks});
  std::mt19937 rng(1);
  auto randomTokens = [&](int n) {
    std::vector<uint32_t> t(n);
    for (auto& id : t) id = 1000 + rng() % 20000;  // Ordinary vocabulary, not specials.
    return t;
  };

  for (int length : {128, 512}) {
    std::vector<uint32_t> prompt = randomTokens(length);
    auto blocks = *cache.allocate(cache.blocksFor(length));
    std::vector<double> times;
    for (int r = 0; r < reps + 1; ++r) {
      engine::SequenceChunk chunk{.tokens = prompt, .start = 0, .blocks = blocks};
      auto start = Clock::now();
      if (!model.forward({&chunk, 1}).ok()) return 1;
      if (r > 0)
        times.push_back(
            std::chrono::duration<double>(Clock::now() - start).count());  // r = 0 warms up.
    }
    cache.release(blocks);
    double t = median(times);
    // Prefill reads the weights once; its KV reads stay in cache (it just wrote them).
    double floor = weight_bytes / bandwidth;
    std::printf("prefill %-14d %12.2f %12.1f %12.2f %10.2f\n", length, t * 1e3, length / t,
                floor * 1e3, floor / t);
  }

  for (int batch : {1, 4, 16, 64}) {
    const int context = 128, steps = 8;
    std::vector<std::vector<int32_t>> tables;
    std::vector<engine::SequenceChunk> prefill;
    std::vector<std::vector<uint32_t>> prompts;
    for (int s = 0; s < batch; ++s) {
      prompts.push_back(randomTokens(context));
      tables.push_back(*cache.allocate(cache.blocksFor(context + steps * (reps + 1) + 1)));
    }
    for (int s = 0; s < batch; ++s)
      prefill.push_back({.tokens = prompts[s], .start = 0, .blocks = tables[s]});
    if (!model.forward(prefill).ok()) return 1;
    std::vector<uint32_t> next(batch, 1234);
    std::vector<double> times;
    int64_t position = context;
    for (int r = 0; r < reps + 1; ++r) {
      auto start = Clock::now();
      for (int step = 0; step < steps; ++step, ++position) {
        std::vector<engine::SequenceChunk> decode;
        for (int s = 0; s < batch; ++s)
          decode.push_back({.tokens = {&next[s], 1}, .start = position, .blocks = tables[s]});
        if (!model.forward(decode).ok()) return 1;
      }
      if (r > 0)
        times.push_back(std::chrono::duration<double>(Clock::now() - start).count() / steps);
    }
    for (auto& table : tables) cache.release(table);
    double t = median(times);
    double floor = (weight_bytes + batch * (context + steps) * kv_bytes_per_token) / bandwidth;
    char name[32];
    std::snprintf(name, sizeof(name), "decode batch %d", batch);
    std::printf("%-22s %12.2f %12.1f %12.2f %10.2f\n", name, t * 1e3, batch / t, floor * 1e3,
                floor / t);
  }
  return 0;
}
