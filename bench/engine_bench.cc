// The CPU engine against its memory floor on a real model: prefill throughput at 128 and
// 512 tokens, and decode at batch 1, 4, 16 and 64 (each sequence holding 128 tokens of
// context). Every time is printed next to its floor, the larger of two bounds measured in
// the same run with the same threads: memory (the bytes the step must read, weights once
// per step + the KV it attends over, over the read bandwidth) and compute (the step's
// multiply-adds over the SIMD peak: int8 VNNI for quantized weights, f32 FMA for float
// weights and attention).
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

#include "kernels/cpu/machine_peaks.h"
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
  double bandwidth = 0, int8_peak = 0, f32_peak = 0;
  {
    cpu::ThreadPool pool(threads);
    bandwidth = cpu::readBandwidth(pool, reps);
    int8_peak = cpu::int8PeakOps(pool);
    f32_peak = cpu::f32PeakFlops(pool);
  }
  // Multiply-adds per token of the linear layers (every token) and the lm-head (the last
  // token of each sequence), and of attention per token per position attended.
  const int64_t h = c.hidden_size, q_dim = int64_t{c.num_heads} * c.head_dim;
  int64_t layer_macs = h * (q_dim + 2 * int64_t{c.num_kv_heads} * c.head_dim) + q_dim * h;
  layer_macs += c.moe
                    ? int64_t{c.moe->experts_per_token} * 3 * c.moe->expert_intermediate_size * h +
                          int64_t{c.moe->num_experts} * h
                    : 3 * int64_t{c.intermediate_size} * h;
  const double linear_macs = static_cast<double>(layer_macs) * c.num_layers;
  const double head_macs = static_cast<double>(c.vocab_size) * h;
  const double attention_macs = 2.0 * c.num_layers * q_dim;
  const bool quantized = model::tensorTypeTraits(model.weightType()).value().block_elements > 1;
  const double linear_peak = quantized && int8_peak > 0 ? int8_peak : f32_peak;
  // Seconds of compute for `tokens` tokens of `sequences` sequences attending over
  // `attended` positions in all.
  auto computeFloor = [&](double tokens, double sequences, double attended) {
    return 2 * (linear_macs * tokens + head_macs * sequences) / linear_peak +
           2 * attention_macs * attended / f32_peak;
  };
  double weight_bytes = 0;
  for (int r = 0; r < tp; ++r) weight_bytes += static_cast<double>(model.weightBytes(r));
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  const double kv_bytes_per_token = 2.0 * c.num_layers * kv_dim * 4;  // f32 keys + values
  std::printf(
      "model %s: %.1f MB of weights read per step; %d threads, tp %d; measured read bandwidth "
      "%.1f GB/s\n",
      path.c_str(), weight_bytes / 1e6, threads, tp, bandwidth / 1e9);
  std::printf("SIMD peak: int8 %.0f GOP/s (VNNI), f32 %.0f GFLOP/s; linear layers count at %s\n",
              int8_peak / 1e9, f32_peak / 1e9, linear_peak == int8_peak ? "int8" : "f32");
  std::printf("%-20s %10s %10s %10s %10s %10s %8s\n", "case", "time (ms)", "tokens/s", "mem (ms)",
              "comp (ms)", "floor (ms)", "floor/t");
  auto report = [&](const char* name, double t, double tokens_per_step, double mem, double comp) {
    const double floor = std::max(mem, comp);
    std::printf("%-20s %10.2f %10.1f %10.2f %10.2f %10.2f %8.2f\n", name, t * 1e3,
                tokens_per_step / t, mem * 1e3, comp * 1e3, floor * 1e3, floor / t);
  };

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
    char name[32];
    std::snprintf(name, sizeof(name), "prefill %d", length);
    // Causal attention: token i attends over i + 1 positions.
    report(name, t, length, weight_bytes / bandwidth,
           computeFloor(length, 1, length * (length + 1) / 2.0));
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
    char name[32];
    std::snprintf(name, sizeof(name), "decode batch %d", batch);
    report(name, t, batch,
           (weight_bytes + batch * (context + steps) * kv_bytes_per_token) / bandwidth,
           computeFloor(batch, batch, batch * (context + steps)));
  }
  return 0;
}
