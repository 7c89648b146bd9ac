// The CPU engine against its memory floor on a real model: prefill throughput at 128 and
// 512 tokens (--prefill gives other lengths), and decode at batch 1, 4, 16 and 64 (--batch gives
// other sizes; each sequence holding --context positions, 128 by default). Every time is printed
// next to its floor, the larger of two bounds against this machine measured in the same run with
// the same threads: memory (the bytes the step must read: weights once per step, the KV it attends
// over, activations; over the read bandwidth) and compute (the step's FLOPs over the SIMD peak:
// int8 for quantized weights, f32 FMA for float weights and attention). The floor is
// roofline::stepFloor over roofline::measureCpuHardware: the code a worker runs for its live
// efficiency metric.
//
// With --verify K each decode batch is timed again as a step verifying K drafts a sequence
// (a chunk of K + 1 rows, every row's logits asked for), and for a model with linear-attention
// layers once more keeping the state after each draft's row (SequenceChunk::row_states):
// what speculative decoding's steps cost against a plain decode step's.
//
// With --tp N the model runs as a tensor-parallel group of N rank threads (threads split
// between them) sharing this machine's memory, so the floor is the same bytes over the same
// bandwidth.
//
// Run: build/default/bin/bench_engine [MODEL.gguf] [--threads N] [--reps R] [--tp N]
//                                     [--context POSITIONS] [--kv-dtype f32|bf16|fp8]
//                                     [--prefill LENGTH,LENGTH...] [--batch SIZE,SIZE...]
//                                     [--verify K] [--bandwidth BYTES_PER_S]
//                                     [--flops WEIGHT_FLOPS_PER_S] [--attention-flops F]
// The KV cache is bf16 unless --kv-dtype says otherwise, as on a worker. The last three flags
// replace the measured values (to compute floors against a worker's).
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

#include "absl/strings/str_format.h"
#include "common/process_init.h"
#include "services/engine/kv_block_pool.h"
#include "services/engine/tp_group.h"
#include "services/roofline/cpu_hardware.h"

namespace {

using namespace cleave;
using Clock = std::chrono::steady_clock;

// A comma-separated list of counts, each 1 or more ("128,512"), into `out`; false if malformed.
bool parseCounts(char* list, std::vector<int>& out) {
  out.clear();
  for (char* p = list; *p;) {
    const long n = std::strtol(p, &p, 10);
    if (n < 1 || (*p != ',' && *p)) return false;
    out.push_back(static_cast<int>(n));
    if (*p == ',') ++p;
  }
  return !out.empty();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// True (after saying why on stderr) when `status` is an error.
bool failed(const absl::Status& status) {
  if (status.ok()) return false;
  std::fprintf(stderr, "bench_engine: %s\n", std::string(status.message()).c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  cleave::initProcess();  // As the servers run.
  std::string path = std::string(CLEAVE_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int reps = 5;
  int tp = 1;
  int context = 128;    // Positions each decoding sequence holds.
  int block_size = 16;  // KV-cache positions per block (a worker's --block-size)
  int verify = 0;       // Drafts a sequence of a timed verifying step (0: none timed)
  std::vector<int> prefill_lengths = {128, 512};
  std::vector<int> batches = {1, 4, 16, 64};
  cpu::KvType kv_type = cpu::kDefaultKvType;  // What workers store unless told otherwise.
  roofline::Hardware given;  // Values given on the command line replace measured ones.
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--tp") && i + 1 < argc)
      tp = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--context") && i + 1 < argc)
      context = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--block-size") && i + 1 < argc)
      block_size = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--verify") && i + 1 < argc)
      verify = std::max(std::atoi(argv[++i]), 0);
    else if (!std::strcmp(argv[i], "--prefill") && i + 1 < argc) {
      if (!parseCounts(argv[++i], prefill_lengths))
        return std::fprintf(stderr, "bench_engine: --prefill needs lengths of 1 or more\n"), 2;
    } else if (!std::strcmp(argv[i], "--batch") && i + 1 < argc) {
      if (!parseCounts(argv[++i], batches))
        return std::fprintf(stderr, "bench_engine: --batch needs sizes of 1 or more\n"), 2;
    } else if (!std::strcmp(argv[i], "--kv-dtype") && i + 1 < argc)
      kv_type = cpu::parseKvType(argv[++i]).value();
    else if (!std::strcmp(argv[i], "--bandwidth") && i + 1 < argc)
      given.bandwidth = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--flops") && i + 1 < argc)
      given.peak_flops = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--attention-flops") && i + 1 < argc)
      given.attention_flops = std::atof(argv[++i]);
    else
      path = argv[i];
  }
  auto group = engine::TpGroup::load(path, {.tp = tp, .threads = threads, .kv_type = kv_type});
  if (!group.ok()) {
    std::fprintf(stderr, "bench_engine: %s\n", std::string(group.status().message()).c_str());
    return 1;
  }
  engine::TpGroup& model = **group;
  const model::ModelConfig& c = model.config();
  const bool quantized = model.multipliesInt8();
  // The hardware and the floor of each step exactly as a worker computes them live, so a
  // worker's cleave_worker_step_efficiency compares with this table.
  roofline::Hardware hw = roofline::measureCpuHardware(threads, quantized, reps, int64_t{1} << 30,
                                                       model.multipliesBf16());
  if (given.bandwidth > 0) hw.bandwidth = given.bandwidth;
  if (given.peak_flops > 0) hw.peak_flops = given.peak_flops;
  if (given.attention_flops > 0) hw.attention_flops = given.attention_flops;
  double weight_bytes = 0;
  double routed_expert_bytes = 0;
  for (int r = 0; r < tp; ++r) {
    weight_bytes += static_cast<double>(model.weightBytes(r));
    routed_expert_bytes += static_cast<double>(model.routedExpertBytes(r));
  }
  auto floorOf = [&](roofline::Workload w) {
    w.weight_bytes = weight_bytes;
    w.routed_expert_bytes = routed_expert_bytes;
    w.float_products = model.floatProducts();
    w.bytes_per_kv = static_cast<double>(cpu::kvElementBytes(kv_type));
    return roofline::stepFloor(c, hw, w).value();
  };
  std::printf(
      "model %s: %.1f MB of weights (%.1f MB of them routed experts, read as chosen); %d "
      "threads, tp %d, %s KV cache; measured read bandwidth %.1f GB/s\n",
      path.c_str(), weight_bytes / 1e6, routed_expert_bytes / 1e6, threads, tp,
      cpu::kvTypeName(kv_type), hw.bandwidth / 1e9);
  // The products at the f32 peak in a model quantized in part (gpt-oss: its attention and head).
  std::string float_products;
  if (quantized) {
    const roofline::Workload::FloatProducts f = model.floatProducts();
    for (const auto& [share, name] : {std::pair{f.attention, "attention"},
                                      {f.mlp, "MLP"},
                                      {f.experts, "experts"},
                                      {f.lm_head, "head"}}) {
      if (share > 0) {
        float_products +=
            absl::StrFormat("%s%s %.0f%%", float_products.empty() ? "" : ", ", name, 100 * share);
      }
    }
  }
  // Float weights multiply on the bf16 dots (CpuMatrix::multipliesBf16) or the f32 FMAs.
  const char* float_unit = model.multipliesBf16() ? "bf16 dot" : "f32";
  std::printf("SIMD peak: %.0f GOP/s for the weights' products (%s)", hw.peak_flops / 1e9,
              quantized ? "int8" : float_unit);
  if (!float_products.empty()) {
    std::printf(", %s %.0f GFLOP/s for the float weights' (%s)", float_unit,
                hw.float_peak_flops / 1e9, float_products.c_str());
  }
  std::printf(", f32 %.0f GFLOP/s for attention\n", hw.attention_flops / 1e9);
  std::printf("%-20s %10s %10s %10s %10s %10s %8s\n", "case", "time (ms)", "tokens/s", "mem (ms)",
              "comp (ms)", "floor (ms)", "floor/t");
  auto report = [&](const char* name, double t, double tokens_per_step,
                    const roofline::Terms& floor) {
    std::printf("%-20s %10.2f %10.1f %10.2f %10.2f %10.2f %8.2f\n", name, t * 1e3,
                tokens_per_step / t, floor.memory_seconds * 1e3, floor.compute_seconds * 1e3,
                floor.floor_seconds * 1e3, floor.floor_seconds / t);
  };

  // Room for 64 decoding sequences (their context and every timed step) or the longest prompt.
  const int64_t longest = *std::max_element(prefill_lengths.begin(), prefill_lengths.end());
  if (block_size < 1) return std::fprintf(stderr, "bench_engine: --block-size must be >= 1\n"), 2;
  const int64_t num_blocks =
      std::max<int64_t>(64 * ((context + 8 * (reps + 1) + verify + 1) / block_size + 1),
                        longest / block_size + 1) +
      40;
  // A model with linear-attention layers keeps each sequence's state in a slot of its own,
  // and with --verify the state after each draft's row in one more a draft.
  const int64_t most = std::max<int64_t>(*std::max_element(batches.begin(), batches.end()), 1);
  const int64_t slots = most * (1 + verify);
  if (failed(model.allocateKv(num_blocks, block_size, /*host_blocks=*/0, slots))) return 1;
  engine::KvBlockPool cache({.block_size = block_size, .num_blocks = num_blocks});
  std::mt19937 rng(1);
  auto randomTokens = [&](int n) {
    std::vector<uint32_t> t(n);
    // Ordinary vocabulary, not specials (a tiny test model's: all of it).
    const uint32_t vocab = c.vocab_size;
    for (auto& id : t) id = vocab > 21000 ? 1000 + rng() % 20000 : rng() % vocab;
    return t;
  };

  for (int length : prefill_lengths) {
    std::vector<uint32_t> prompt = randomTokens(length);
    auto blocks = *cache.allocate(cache.blocksFor(length));
    std::vector<double> times;
    for (int r = 0; r < reps + 1; ++r) {
      engine::SequenceChunk chunk{.tokens = prompt, .start = 0, .blocks = blocks, .state = 0};
      auto start = Clock::now();
      if (failed(model.forward({&chunk, 1}).status())) return 1;
      if (r > 0)
        times.push_back(
            std::chrono::duration<double>(Clock::now() - start).count());  // r = 0 warms up.
    }
    cache.release(blocks);
    double t = median(times);
    char name[32];
    std::snprintf(name, sizeof(name), "prefill %d", length);
    // Causal attention: token i attends over i + 1 positions.
    report(name, t, length, floorOf(roofline::prefillChunk(length, 0, c.sliding_window)));
  }

  for (int batch : batches) {
    const int steps = 8;
    std::vector<std::vector<int32_t>> tables;
    std::vector<engine::SequenceChunk> prefill;
    std::vector<std::vector<uint32_t>> prompts;
    for (int s = 0; s < batch; ++s) {
      prompts.push_back(randomTokens(context));
      tables.push_back(*cache.allocate(cache.blocksFor(context + steps * (reps + 1) + verify + 1)));
    }
    for (int s = 0; s < batch; ++s)
      prefill.push_back({.tokens = prompts[s], .start = 0, .blocks = tables[s], .state = s});
    if (failed(model.forward(prefill).status())) return 1;
    std::vector<uint32_t> next(batch, 1234 % c.vocab_size);
    std::vector<double> times;
    int64_t position = context;
    for (int r = 0; r < reps + 1; ++r) {
      auto start = Clock::now();
      for (int step = 0; step < steps; ++step, ++position) {
        std::vector<engine::SequenceChunk> decode;
        for (int s = 0; s < batch; ++s)
          decode.push_back(
              {.tokens = {&next[s], 1}, .start = position, .blocks = tables[s], .state = s});
        if (failed(model.forward(decode).status())) return 1;
      }
      if (r > 0)
        times.push_back(std::chrono::duration<double>(Clock::now() - start).count() / steps);
    }
    double t = median(times);
    char name[32];
    std::snprintf(name, sizeof(name), "decode batch %d", batch);
    // Positions attended in the middle step of a timed run.
    const int64_t positions = context + steps / 2 + 1;
    report(name, t, batch, floorOf(roofline::decodeStep(batch, positions, c.sliding_window)));
    // Verifying steps, all at the position after the decode steps (their KV written over
    // each time): rows per second in the tokens/s column, the floor as if each row were a
    // sequence of its own.
    std::vector<uint32_t> rows(verify + 1, 1234 % c.vocab_size);
    for (const bool keep : {false, true}) {
      if (verify == 0 || (keep && !c.linear_attention)) break;
      std::vector<std::vector<int32_t>> row_states(batch);
      for (int s = 0; s < batch && keep; ++s)
        for (int k = 0; k < verify; ++k)
          row_states[s].push_back(static_cast<int32_t>(most + s * verify + k));
      std::vector<engine::SequenceChunk> step;
      for (int s = 0; s < batch; ++s)
        step.push_back({.tokens = rows,
                        .start = position,
                        .blocks = tables[s],
                        .logits = verify + 1,
                        .state = s,
                        .row_states = row_states[s]});
      std::vector<double> verify_times;
      for (int r = 0; r < reps + 1; ++r) {
        auto start = Clock::now();
        if (failed(model.forward(step).status())) return 1;
        if (r > 0)
          verify_times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      }
      if (keep)
        std::snprintf(name, sizeof(name), "  + row states");
      else
        std::snprintf(name, sizeof(name), "verify %dx%d", batch, verify + 1);
      report(name, median(verify_times), batch * (verify + 1),
             floorOf(roofline::decodeStep(batch * (verify + 1), position, c.sliding_window)));
    }
    for (auto& table : tables) cache.release(table);
  }
  return 0;
}
