// GPU benchmarks, each next to a ceiling measured in the same run: a device-to-device copy
// (bytes read + written per second) and a large bf16 product through cuBLASLt. Prints a
// table: paged decode attention (GB/s, % of the copy), prefill attention (TFLOP/s, % of
// the product), and a whole decode step of a random-weight Llama-3-8B-shaped model at
// batch 16, context 2048, with CUDA graphs, against its roofline floor (weights + KV read
// over the copy bandwidth); the skinny GEMM against cuBLASLt at decode batch sizes;
// Qwen3-30B-A3B-shaped MoE: one MoE layer at batch 16 in bf16 and NVFP4 (W4A16) against the
// bytes of the experts it touches, and a whole decode step; decode steps of DeepSeek-V2-Lite
// and gpt-oss-120b shapes (its MXFP4 experts as the NVFP4 they load as) and of Qwen3-Next-80B-A3B
// (NVFP4 experts; its linear-attention states counted as read and written); Qwen3.5's Gated
// DeltaNet layer (convolution and delta rule) at decode batch 16 against the bytes of the
// states it reads and writes, and over a 4096-token prompt; last, small all-reduces,
// one-shot P2P against NCCL.
//
// Times are medians of event-timed repetitions after warm-up; attention inputs rotate
// between two sets larger than the L2 cache; every input is random (never zeros).
//
// Usage: bench_cuda [--quick]   (scripts/device-check.sh runs it on a GPU machine)
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/model/model_config.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gated_delta_net.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mla_attention.h"
#include "kernels/cuda/moe_gemm.h"
#include "kernels/cuda/p2p_allreduce.h"
#include "kernels/cuda/prefill_attention.h"
#include "services/engine/cuda_llama_model.h"
#include "services/engine/cuda_moe_layer.h"
#include "services/engine/gated_delta_net.h"
#include "services/engine/nccl_communicator.h"

namespace cleave {
namespace {

using bf16 = __nv_bfloat16;

// A failed call ends the benchmark it is in (main turns it into a FAILED row), not the run:
// the rows measured before it still print.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
void check(const absl::Status& s, const char* what) {
  if (!s.ok()) throw Failure(std::string(what) + ": " + s.ToString());
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Failure(std::string(what) + ": " + cudaGetErrorString(e));
}

template <typename T>
T* deviceAlloc(size_t count) {
  void* p = nullptr;
  check(cudaMalloc(&p, count * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

bf16* randomBf16(size_t count, uint64_t seed, float scale = 1.0f) {
  bf16* p = deviceAlloc<bf16>(count);
  check(cuda::fillUniform(p, static_cast<int64_t>(count), -scale, scale, seed, nullptr), "fill");
  return p;
}

// Median milliseconds of `reps` runs of `run(i)` timed with events, after `warmup` runs.
double medianMs(const std::function<void(int)>& run, int reps, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) run(i);
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(start), "record");
    run(i);
    check(cudaEventRecord(stop), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    times.push_back(ms);
  }
  check(cudaGetLastError(), "kernels");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Row {
  std::string what;
  double ms;
  std::string rate;     // achieved
  std::string ceiling;  // % of the measured ceiling
  std::string target;
};
std::vector<Row> rows;

void printRow(const Row& r) {
  std::printf("%-66s %10.3f %16s %14s %8s\n", r.what.c_str(), r.ms, r.rate.c_str(),
              r.ceiling.c_str(), r.target.c_str());
  std::fflush(stdout);
}

// Each row prints as it is measured (a run cut short keeps what it had) and again in the
// table at the end.
void addRow(Row r) {
  printRow(r);
  rows.push_back(std::move(r));
}

// Runs one benchmark; a failure becomes a row saying so and the run goes on.
void attempt(const char* what, const std::function<void()>& benchmark) {
  try {
    benchmark();
  } catch (const Failure& e) {
    std::fprintf(stderr, "%s FAILED: %s\n", what, e.what());
    addRow({std::string(what) + " FAILED: " + e.what(), 0, "", "", ""});
  }
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

double copyBandwidth(int reps) {
  const size_t bytes = size_t{1} << 30;
  void* a = deviceAlloc<uint8_t>(bytes);
  void* b = deviceAlloc<uint8_t>(bytes);
  check(cudaMemset(a, 0x5a, bytes), "memset");
  const double ms =
      medianMs([&](int) { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); }, reps);
  cudaFree(a);
  cudaFree(b);
  const double gbs = 2.0 * bytes / (ms * 1e-3) / 1e9;
  addRow({"copy 1 GiB device to device (read + write)", ms, fmt("%.0f GB/s", gbs), "ceiling", ""});
  return gbs;
}

double matmulPeak(cuda::Gemm& gemm, int reps) {
  const int64_t n = 8192;
  bf16* x = randomBf16(n * n, 1);
  bf16* w = randomBf16(n * n, 2, 0.01f);
  bf16* y = deviceAlloc<bf16>(n * n);
  const double ms = medianMs(
      [&](int) {
        check(gemm.run({.x = x,
                        .x_stride = n,
                        .w = w,
                        .tokens = n,
                        .out = n,
                        .in = n,
                        .y = y,
                        .y_stride = n},
                       nullptr),
              "gemm");
      },
      reps);
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  const double tflops = 2.0 * n * n * n / (ms * 1e-3) / 1e12;
  addRow({"bf16 matmul 8192^3 (cuBLASLt)", ms, fmt("%.0f TFLOP/s", tflops), "ceiling", ""});
  return tflops;
}

struct AttentionShape {
  int batch, context, heads, kv_heads, head_dim, block_size;
  cuda::KvDtype kv = cuda::KvDtype::kBf16;
};

void decodeAttention(const AttentionShape& a, double copy_gbs, int sms, int reps,
                     const char* target) {
  const int blocks_per_seq = (a.context + a.block_size - 1) / a.block_size;
  const size_t cache =
      static_cast<size_t>(a.batch) * blocks_per_seq * a.kv_heads * a.block_size * a.head_dim;
  // e4m3 caches are timed on random bytes as they are (their bf16 fill read as e4m3 pairs):
  // half the bytes of the bf16 ones.
  const bool fp8 = a.kv == cuda::KvDtype::kFp8E4M3;
  const size_t fill = fp8 ? cache / 2 : cache;
  bf16* k[2] = {randomBf16(fill, 11), randomBf16(fill, 12)};
  bf16* v[2] = {randomBf16(fill, 13), randomBf16(fill, 14)};
  bf16* q = randomBf16(static_cast<size_t>(a.batch) * a.heads * a.head_dim, 15);
  bf16* out = deviceAlloc<bf16>(static_cast<size_t>(a.batch) * a.heads * a.head_dim);
  std::vector<int32_t> tables(static_cast<size_t>(a.batch) * blocks_per_seq);
  std::iota(tables.begin(), tables.end(), 0);
  std::vector<int32_t> lens(a.batch, a.context);
  int32_t* dtables = deviceAlloc<int32_t>(tables.size());
  int32_t* dlens = deviceAlloc<int32_t>(lens.size());
  check(cudaMemcpy(dtables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice), "copy");
  check(cudaMemcpy(dlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice), "copy");
  auto plan = cuda::planDecodeAttention({.heads = a.heads,
                                         .kv_heads = a.kv_heads,
                                         .head_dim = a.head_dim,
                                         .block_size = a.block_size,
                                         .max_batch = a.batch,
                                         .max_context = a.context,
                                         .scale = 1.0f / std::sqrt(float(a.head_dim)),
                                         .kv_dtype = a.kv},
                                        sms);
  check(plan.status(), "plan");
  void* workspace = deviceAlloc<uint8_t>(std::max<size_t>(plan->workspace_bytes, 1));
  const double ms = medianMs(
      [&](int i) {
        check(cuda::runDecodeAttention(*plan,
                                       {.q = q,
                                        .q_stride = a.heads * a.head_dim,
                                        .k_cache = k[i % 2],
                                        .v_cache = v[i % 2],
                                        .block_tables = dtables,
                                        .max_blocks_per_seq = blocks_per_seq,
                                        .seq_lens = dlens,
                                        .batch = a.batch,
                                        .out = out,
                                        .out_stride = a.heads * a.head_dim,
                                        .workspace = workspace},
                                       nullptr),
              "decode attention");
      },
      reps);
  const double bytes = 2.0 * a.batch * a.context * a.kv_heads * a.head_dim * (fp8 ? 1 : 2) +
                       2.0 * a.batch * a.heads * a.head_dim * sizeof(bf16);
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  char what[160];
  std::snprintf(what, sizeof(what),
                "decode attention %s b%d ctx%d %d/%d heads d%d page%d (%d parts)",
                fp8 ? "e4m3" : "bf16", a.batch, a.context, a.heads, a.kv_heads, a.head_dim,
                a.block_size, plan->partitions);
  addRow({what, ms, fmt("%.0f GB/s", gbs), fmt("%.0f%%", 100 * gbs / copy_gbs), target});
  for (bf16* p : {k[0], k[1], v[0], v[1], q, out}) cudaFree(p);
  cudaFree(dtables);
  cudaFree(dlens);
  cudaFree(workspace);
}

// Latent attention's decode (DeepSeek-V3: a 512 + 64 latent row per position shared by every
// head) against the bytes it must read: each position's row once, and the queries.
void mlaDecodeAttention(int batch, int context, int heads, cuda::KvDtype kv, double copy_gbs,
                        int sms, int reps) {
  constexpr int kLora = 512, kRope = 64, kRow = kLora + kRope, kBlock = 64;
  const bool fp8 = kv == cuda::KvDtype::kFp8E4M3;
  const int blocks_per_seq = (context + kBlock - 1) / kBlock;
  const size_t cache = static_cast<size_t>(batch) * blocks_per_seq * kBlock * kRow;
  bf16* latent[2] = {randomBf16(fp8 ? cache / 2 : cache, 21),
                     randomBf16(fp8 ? cache / 2 : cache, 22)};
  bf16* q = randomBf16(static_cast<size_t>(batch) * heads * kRow, 23);
  bf16* out = deviceAlloc<bf16>(static_cast<size_t>(batch) * heads * kLora);
  std::vector<int32_t> tables(static_cast<size_t>(batch) * blocks_per_seq);
  std::iota(tables.begin(), tables.end(), 0);
  std::vector<int32_t> positions(batch, context - 1), starts(batch + 1);
  std::iota(starts.begin(), starts.end(), 0);
  int32_t* dtables = deviceAlloc<int32_t>(tables.size());
  int32_t* dpositions = deviceAlloc<int32_t>(positions.size());
  int32_t* dstarts = deviceAlloc<int32_t>(starts.size());
  check(cudaMemcpy(dtables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice), "copy");
  check(cudaMemcpy(dpositions, positions.data(), positions.size() * 4, cudaMemcpyHostToDevice),
        "copy");
  check(cudaMemcpy(dstarts, starts.data(), starts.size() * 4, cudaMemcpyHostToDevice), "copy");
  auto plan = cuda::planMlaAttention({.heads = heads,
                                      .kv_lora = kLora,
                                      .rope = kRope,
                                      .block_size = kBlock,
                                      .max_tokens = batch,
                                      .max_context = context,
                                      .kv_dtype = kv},
                                     sms);
  check(plan.status(), "mla plan");
  void* workspace = deviceAlloc<uint8_t>(std::max<size_t>(plan->workspace_bytes, 1));
  const double ms = medianMs(
      [&](int i) {
        check(cuda::mlaAttention(*plan,
                                 {.q = q,
                                  .q_stride = heads * kRow,
                                  .cache = latent[i % 2],
                                  .kv_dtype = kv,
                                  .kv_scale = 0.05f,
                                  .positions = dpositions,
                                  .q_starts = dstarts,
                                  .block_tables = dtables,
                                  .max_blocks_per_seq = blocks_per_seq,
                                  .sequences = batch,
                                  .tokens = batch,
                                  .heads = heads,
                                  .kv_lora = kLora,
                                  .rope = kRope,
                                  .block_size = kBlock,
                                  .scale = 1.0f / std::sqrt(192.0f),
                                  .out = out,
                                  .out_stride = heads * kLora,
                                  .workspace = workspace},
                                 nullptr),
              "mla attention");
      },
      reps);
  const double bytes = static_cast<double>(batch) * context * kRow * (fp8 ? 1 : 2) +
                       static_cast<double>(batch) * heads * (kRow + kLora) * sizeof(bf16);
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  char what[160];
  std::snprintf(what, sizeof(what), "latent attention %s b%d ctx%d %d heads 512+64 page%d",
                fp8 ? "e4m3" : "bf16", batch, context, heads, kBlock);
  addRow({what, ms, fmt("%.0f GB/s", gbs), fmt("%.0f%%", 100 * gbs / copy_gbs), ""});
  for (bf16* p : {latent[0], latent[1], q, out}) cudaFree(p);
  for (int32_t* p : {dtables, dpositions, dstarts}) cudaFree(p);
  cudaFree(workspace);
}

void prefillAttention(int tokens, double peak_tflops, int reps) {
  const int heads = 32, kv_heads = 8, head_dim = 128, block_size = 16;
  const int blocks = (tokens + block_size - 1) / block_size;
  const size_t cache = static_cast<size_t>(blocks) * kv_heads * block_size * head_dim;
  bf16* k = randomBf16(cache, 21);
  bf16* v = randomBf16(cache, 22);
  bf16* q = randomBf16(static_cast<size_t>(tokens) * heads * head_dim, 23);
  bf16* out = deviceAlloc<bf16>(static_cast<size_t>(tokens) * heads * head_dim);
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  std::vector<int32_t> starts = {0, tokens}, context = {tokens};
  int32_t* dtable = deviceAlloc<int32_t>(blocks);
  int32_t* dstarts = deviceAlloc<int32_t>(2);
  int32_t* dcontext = deviceAlloc<int32_t>(1);
  check(cudaMemcpy(dtable, table.data(), blocks * 4, cudaMemcpyHostToDevice), "copy");
  check(cudaMemcpy(dstarts, starts.data(), 8, cudaMemcpyHostToDevice), "copy");
  check(cudaMemcpy(dcontext, context.data(), 4, cudaMemcpyHostToDevice), "copy");
  auto plan = cuda::planPrefillAttention({.heads = heads,
                                          .kv_heads = kv_heads,
                                          .head_dim = head_dim,
                                          .block_size = block_size,
                                          .max_sequences = 1,
                                          .max_new_tokens = tokens,
                                          .scale = 1.0f / std::sqrt(float(head_dim))});
  check(plan.status(), "plan");
  const double ms = medianMs(
      [&](int) {
        check(cuda::runPrefillAttention(*plan,
                                        {.q = q,
                                         .q_stride = heads * head_dim,
                                         .k_cache = k,
                                         .v_cache = v,
                                         .block_tables = dtable,
                                         .max_blocks_per_seq = blocks,
                                         .q_starts = dstarts,
                                         .context_lens = dcontext,
                                         .sequences = 1,
                                         .out = out,
                                         .out_stride = heads * head_dim},
                                        nullptr),
              "prefill attention");
      },
      reps);
  // Causal: query i attends to i + 1 keys; QK^T and PV are 2 FLOPs per multiply-add each.
  const double flops = 4.0 * head_dim * heads * (double(tokens) * (tokens + 1) / 2);
  const double tflops = flops / (ms * 1e-3) / 1e12;
  char what[128];
  std::snprintf(what, sizeof(what), "prefill attention %d tokens causal 32/8 heads d128", tokens);
  addRow(
      {what, ms, fmt("%.0f TFLOP/s", tflops), fmt("%.0f%%", 100 * tflops / peak_tflops), ">= 50%"});
  for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q),
                  static_cast<void*>(out), static_cast<void*>(dtable), static_cast<void*>(dstarts),
                  static_cast<void*>(dcontext)})
    cudaFree(p);
}

// Prefills `batch` sequences to context - 1 positions (one sequence per step), then times
// `steps` decode steps of all of them together (greedy, drawn on the GPU), the median over
// the steps after the first five (the graphs are warmed and captured by then).
double medianDecodeStepMs(engine::CudaLlamaModel& model, int64_t vocab, int batch, int context,
                          int steps) {
  std::vector<std::vector<int32_t>> blocks(batch);
  const int64_t per_seq = (context + steps + 8 + 15) / 16;
  for (int s = 0; s < batch; ++s)
    for (int64_t b = 0; b < per_seq; ++b)
      blocks[s].push_back(static_cast<int32_t>(s * per_seq + b));
  std::vector<uint32_t> prompt(context - 1);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<uint32_t>((i * 7919) % vocab);
  for (int s = 0; s < batch; ++s) {
    // Each sequence in its own linear-attention state slot (ignored by other models).
    engine::SequenceChunk chunk{.tokens = prompt, .start = 0, .blocks = blocks[s], .state = s};
    check(model.forward({&chunk, 1}).status(), "prefill");
  }
  std::vector<std::vector<uint32_t>> next(batch, std::vector<uint32_t>{1});
  // As a server's step: every token drawn on the GPU, no logits copied back.
  const std::vector<engine::RowOutput> rows(batch, {.draw = engine::DeviceDraw{}});
  std::vector<double> times;
  for (int step = 0; step < steps; ++step) {
    std::vector<engine::SequenceChunk> chunks;
    for (int s = 0; s < batch; ++s)
      chunks.push_back(
          {.tokens = next[s], .start = context - 1 + step, .blocks = blocks[s], .state = s});
    const auto t0 = std::chrono::steady_clock::now();
    auto out = model.forwardAndDraw(chunks, rows);
    const auto t1 = std::chrono::steady_clock::now();
    check(out.status(), "decode step");
    if (step >= 5) times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    for (int s = 0; s < batch; ++s) next[s] = {static_cast<uint32_t>(out->tokens[s])};
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void decodeStep(double copy_gbs, bool quick) {
  model::ModelConfig c;
  c.architecture = model::Architecture::kLlama;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = quick ? 8 : 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.vocab_size = 128256;
  c.rope_theta = 500000;
  c.rms_norm_eps = 1e-5;
  const int batch = 16, context = 2048, steps = 30;
  auto model = engine::CudaLlamaModel::createRandom(
      c, {.max_step_tokens = context, .max_sequences = batch, .max_context = context + steps + 8},
      7);
  check(model.status(), "random model");
  const double ms = medianDecodeStepMs(**model, c.vocab_size, batch, context, steps);
  // Roofline floor: weights once, every sequence's KV once, over the measured copy rate.
  const double kv = 2.0 * batch * context * c.num_layers * c.num_kv_heads * c.head_dim * 2;
  const double floor_ms = ((*model)->weightBytes() + kv) / (copy_gbs * 1e9) * 1e3;
  char what[160];
  std::snprintf(what, sizeof(what),
                "decode step Llama-3-8B shape%s b%d ctx%d, graphs (floor %.2f ms)",
                quick ? " (8 layers)" : "", batch, context, floor_ms);
  addRow({what, ms, fmt("%.2f ms", ms), fmt("%.0f%% of floor", 100 * floor_ms / ms), ">= 60%"});
}

// Decode-size products of Llama-3-8B's shapes (QKV, gate/up, down) at batch 1, 4 and 16:
// cuBLASLt against the skinny GEMM (moe_gemm.h) in bf16 and NVFP4, each as weight bytes
// read per second against the copy bandwidth. Which one the model should use is this
// table's call.
void skinnyGemm(double copy_gbs, int reps, cuda::Gemm& gemm) {
  check(cuda::prepareMoeGemm(), "moe gemm");
  struct Shape {
    const char* name;
    int64_t out, in;
  };
  for (const Shape& shape :
       {Shape{"qkv 6144x4096", 6144, 4096}, Shape{"gate/up 28672x4096", 28672, 4096},
        Shape{"down 4096x14336", 4096, 14336}}) {
    const int64_t n = shape.out, k = shape.in;
    bf16* w = randomBf16(n * k, 21, 0.02f);
    uint8_t* codes = reinterpret_cast<uint8_t*>(randomBf16(n * k / 4, 22));
    uint8_t* groups = deviceAlloc<uint8_t>(n * k / 16);
    check(cudaMemset(groups, 0x30, n * k / 16), "scales");
    float* row_scales = deviceAlloc<float>(n);
    const std::vector<float> ones(n, 0.01f);
    check(cudaMemcpy(row_scales, ones.data(), n * 4, cudaMemcpyHostToDevice), "row scales");
    bf16* x = randomBf16(16 * k, 23);
    bf16* y = deviceAlloc<bf16>(16 * n);
    const int64_t scratch_bytes = cuda::nativeScratchBytes(cuda::ExpertWeightFormat::kNvfp4, 16, k);
    uint8_t* scratch = deviceAlloc<uint8_t>(static_cast<size_t>(scratch_bytes));
    for (int batch : {1, 4, 16}) {
      const double bf16_bytes = 2.0 * n * k, fp4_bytes = n * k / 2.0 + n * k / 16.0 + 4.0 * n;
      auto add = [&](const char* how, double ms, double bytes) {
        char what[160];
        std::snprintf(what, sizeof(what), "product %s b%d %s", shape.name, batch, how);
        const double gbs = bytes / (ms * 1e-3) / 1e9;
        addRow({what, ms, fmt("%.0f GB/s", gbs), fmt("%.0f%% of copy", 100 * gbs / copy_gbs), ""});
      };
      add("cuBLASLt bf16",
          medianMs(
              [&](int) {
                check(gemm.run({.x = x,
                                .x_stride = k,
                                .w = w,
                                .tokens = batch,
                                .out = n,
                                .in = k,
                                .y = y,
                                .y_stride = n},
                               nullptr),
                      "gemm");
              },
              reps),
          bf16_bytes);
      // NVFP4 widened to bf16 (W4A16, any device) and, on sm_120a, on the block-scaled
      // E2M1 MMA with the activations quantized first (W4A4, quantization included).
      struct Variant {
        const char* name;
        cuda::ExpertWeightFormat format;
        cuda::GemmOperands operands;
      };
      for (const Variant& v :
           {Variant{"skinny bf16", cuda::ExpertWeightFormat::kBf16, cuda::GemmOperands::kWidened},
            Variant{"skinny nvfp4 W4A16", cuda::ExpertWeightFormat::kNvfp4,
                    cuda::GemmOperands::kWidened},
            Variant{"skinny nvfp4 W4A4", cuda::ExpertWeightFormat::kNvfp4,
                    cuda::GemmOperands::kNative}}) {
        const bool fp4 = v.format == cuda::ExpertWeightFormat::kNvfp4;
        if (v.operands == cuda::GemmOperands::kNative && !cuda::nativeOperandsPreferred(v.format))
          continue;
        const cuda::ExpertWeights weights{.format = v.format,
                                          .experts = 1,
                                          .rows = n,
                                          .cols = k,
                                          .data = fp4 ? static_cast<const void*>(codes) : w,
                                          .group_scales = fp4 ? groups : nullptr,
                                          .row_scales = fp4 ? row_scales : nullptr};
        add(v.name,
            medianMs(
                [&](int) {
                  check(cuda::runSkinnyGemm({.x = x,
                                             .x_stride = k,
                                             .rows = batch,
                                             .weights = weights,
                                             .y = y,
                                             .y_stride = n,
                                             .operands = v.operands,
                                             .scratch = scratch,
                                             .scratch_bytes = scratch_bytes},
                                            nullptr),
                        "skinny gemm");
                },
                reps),
            fp4 ? fp4_bytes : bf16_bytes);
      }
    }
    for (void* p : {static_cast<void*>(w), static_cast<void*>(codes), static_cast<void*>(groups),
                    static_cast<void*>(row_scales), static_cast<void*>(x), static_cast<void*>(y),
                    static_cast<void*>(scratch)})
      cudaFree(p);
  }
}

// Small all-reduces: the one-shot P2P kernel against NCCL over every visible GPU (with one
// GPU both run a group of one — launch and synchronization cost only, no transfer; the
// row says how many ranks ran).
void allReduce(int reps) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "devices");
  std::vector<int> devices(count);
  std::iota(devices.begin(), devices.end(), 0);
  auto nccl = engine::NcclCommunicator::createGroup(devices, false);
  check(nccl.status(), "nccl group");
  auto p2p = cuda::P2pAllReduce::create(devices);
  if (!p2p.ok()) {
    std::printf("p2p all-reduce unavailable: %s\n", p2p.status().ToString().c_str());
    return;
  }
  for (int64_t bytes : {int64_t{16} << 10, int64_t{64} << 10, int64_t{256} << 10}) {
    const int64_t n = bytes / 4;
    std::vector<float*> data(count);
    for (int r = 0; r < count; ++r) {
      check(cudaSetDevice(devices[r]), "device");
      data[r] = deviceAlloc<float>(n);
      check(cudaMemset(data[r], 0, bytes), "memset");
    }
    // Every rank's thread runs `op` reps times after warm-up; the median over ranks of
    // their median per-call time.
    auto timed = [&](const std::function<void(int, int)>& op) {
      std::vector<double> per_rank(count);
      std::vector<std::string> failures(count);  // A thread's Failure, raised after the join.
      std::vector<std::thread> threads;
      for (int r = 0; r < count; ++r) {
        threads.emplace_back([&, r] {
          try {
            check(cudaSetDevice(devices[r]), "device");
            std::vector<double> t;
            for (int i = 0; i < reps + 5; ++i) {
              const auto t0 = std::chrono::steady_clock::now();
              op(r, i);
              const auto t1 = std::chrono::steady_clock::now();
              if (i >= 5) t.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
            }
            std::sort(t.begin(), t.end());
            per_rank[r] = t[t.size() / 2];
          } catch (const Failure& e) {
            failures[r] = e.what();
          }
        });
      }
      for (auto& t : threads) t.join();
      for (const std::string& f : failures)
        if (!f.empty()) throw Failure(f);
      std::sort(per_rank.begin(), per_rank.end());
      return per_rank[per_rank.size() / 2];
    };
    const double nccl_ms = timed([&](int r, int) {
      check((*nccl)[r]->allReduceSum({data[r], static_cast<size_t>(n)}), "nccl all-reduce");
    });
    const double p2p_ms = timed([&](int r, int) {
      check((*p2p)->run(r, data[r], n, (*nccl)[r]->stream()), "p2p all-reduce");
      check(cudaStreamSynchronize((*nccl)[r]->stream()), "p2p sync");
    });
    char what[160];
    std::snprintf(what, sizeof(what), "all-reduce %lld KiB over %d GPU%s: NCCL",
                  static_cast<long long>(bytes >> 10), count, count > 1 ? "s" : "");
    addRow({what, nccl_ms, fmt("%.1f us", nccl_ms * 1e3), "", ""});
    std::snprintf(what, sizeof(what), "all-reduce %lld KiB over %d GPU%s: one-shot P2P",
                  static_cast<long long>(bytes >> 10), count, count > 1 ? "s" : "");
    addRow({what, p2p_ms, fmt("%.1f us", p2p_ms * 1e3), fmt("%.2fx NCCL's time", p2p_ms / nccl_ms),
            ""});
    for (int r = 0; r < count; ++r) cudaFree(data[r]);
  }
}

model::ModelConfig qwen3MoeShape(int layers) {
  model::ModelConfig c;
  c.architecture = model::Architecture::kQwen3Moe;
  c.hidden_size = 2048;
  c.intermediate_size = 6144;
  c.num_layers = layers;
  c.num_heads = 32;
  c.num_kv_heads = 4;
  c.head_dim = 128;
  c.vocab_size = 151936;
  c.rope_theta = 1000000;
  c.rms_norm_eps = 1e-6;
  c.moe = model::MoeConfig{.num_experts = 128,
                           .experts_per_token = 8,
                           .expert_intermediate_size = 768,
                           .norm_topk_prob = true};
  return c;
}

// Expected distinct experts of `tokens` tokens routed uniformly to k of E.
double expectedTouched(int tokens, int k, int experts) {
  return experts * (1.0 - std::pow(1.0 - double(k) / experts, tokens));
}

// One MoE layer of Qwen3-30B-A3B's shape at decode batch 16 (router, routing, layout,
// gate/up, down, combine), against the bandwidth floor of the experts the batch touches.
void moeLayer(double copy_gbs, cuda::ExpertWeightFormat format, int reps, cuda::Gemm& gemm) {
  const model::ModelConfig c = qwen3MoeShape(1);
  const int batch = 16;
  auto shape = engine::cudaMoeShape(c, *engine::planShard(c, {}), {}, format, batch, batch);
  check(shape.status(), "moe shape");
  check(cuda::prepareMoeGemm(), "moe gemm");
  engine::Arena count;
  engine::placeMoeWeights(count, *shape);
  engine::placeMoeWorkspace(count, *shape);
  uint8_t* base = deviceAlloc<uint8_t>(static_cast<size_t>(count.used()));
  engine::Arena arena(base);
  const engine::CudaMoeWeights w = engine::placeMoeWeights(arena, *shape);
  const engine::CudaMoeWorkspace ws = engine::placeMoeWorkspace(arena, *shape);
  check(engine::fillRandomMoe(*shape, w, 11, nullptr), "random experts");
  bf16* h = randomBf16(batch * c.hidden_size, 12);
  bf16* out = deviceAlloc<bf16>(batch * c.hidden_size);
  const double ms = medianMs(
      [&](int) {
        check(engine::enqueueMoe(*shape, w, ws, h, batch, true, out, gemm, nullptr), "moe layer");
      },
      reps);
  std::vector<int32_t> ids(batch * shape->k());
  check(cudaMemcpy(ids.data(), ws.expert_ids, ids.size() * 4, cudaMemcpyDeviceToHost), "ids");
  std::sort(ids.begin(), ids.end());
  const int64_t touched = std::unique(ids.begin(), ids.end()) - ids.begin();
  const double bytes = double(touched) * engine::moeExpertBytes(*shape);
  const double floor_ms = bytes / (copy_gbs * 1e9) * 1e3;
  char what[160];
  std::snprintf(
      what, sizeof(what), "MoE layer Qwen3-30B-A3B %s%s b%d, %lld experts (floor %.3f ms)",
      cuda::expertWeightFormatName(format), cuda::nativeOperandsPreferred(format) ? " native" : "",
      batch, static_cast<long long>(touched), floor_ms);
  addRow({what, ms, fmt("%.0f GB/s", bytes / (ms * 1e-3) / 1e9),
          fmt("%.0f%% of floor", 100 * floor_ms / ms), ">= 70%"});
  cudaFree(base);
  cudaFree(h);
  cudaFree(out);
}

// DeepSeek-V2-Lite's shape (16B, 2.4B active): latent attention (512 + 64, full-rank Q), 64
// routed experts of which 6 per token, 2 shared, the first layer dense.
model::ModelConfig deepseekV2LiteShape(int layers) {
  model::ModelConfig c;
  c.architecture = model::Architecture::kDeepseekV3;
  c.model_type = "deepseek_v2";
  c.hidden_size = 2048;
  c.intermediate_size = 10944;
  c.num_layers = layers;
  c.num_heads = 16;
  c.num_kv_heads = 16;
  c.head_dim = 128 + 64;
  c.vocab_size = 102400;
  c.rope_theta = 10000;
  c.rms_norm_eps = 1e-6;
  c.mla = model::MlaConfig{
      .kv_lora_rank = 512, .qk_nope_head_dim = 128, .qk_rope_head_dim = 64, .v_head_dim = 128};
  c.moe = model::MoeConfig{.num_experts = 64,
                           .experts_per_token = 6,
                           .expert_intermediate_size = 1408,
                           .shared_experts = 2,
                           .shared_expert_intermediate_size = 1408,
                           .first_k_dense = 1};
  return c;
}

// gpt-oss-120b's shape (117B, 5.1B active): 36 layers alternating a 128-position sliding
// window and full attention, 64 query and 8 KV heads of 64 with sinks, biases on Q/K/V/O, the
// router and the experts, 128 experts of which 4 per token with the clamped SwiGLU, YaRN.
model::ModelConfig gptOss120bShape(int layers) {
  model::ModelConfig c;
  c.architecture = model::Architecture::kGptOss;
  c.model_type = "gpt_oss";
  c.hidden_size = 2880;
  c.intermediate_size = 2880;
  c.num_layers = layers;
  c.num_heads = 64;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.vocab_size = 201088;
  c.rope_theta = 150000;
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = 32.0;
  c.rope_scaling.original_max_position_embeddings = 4096;
  c.rope_scaling.truncate = false;
  c.rms_norm_eps = 1e-5;
  c.attention_bias = c.o_bias = c.attention_sinks = true;
  c.sliding_window = 128;
  for (int l = 0; l < layers; ++l) c.sliding_layers.push_back(l % 2 == 0);
  c.moe = model::MoeConfig{.num_experts = 128,
                           .experts_per_token = 4,
                           .expert_intermediate_size = 2880,
                           .norm_topk_prob = true,
                           .router_bias = true,
                           .expert_bias = true,
                           .swiglu_limit = 7.0};
  return c;
}

// A whole decode step of a random MoE model at batch 16, context 1024, with CUDA graphs,
// against its floor: the weights outside the routed experts (router and shared experts
// included), the routed experts a batch of 16 touches per MoE layer (expected count under
// uniform routing) and the KV cache.
void moeDecodeStep(const char* name, const model::ModelConfig& c, double copy_gbs,
                   cuda::ExpertWeightFormat format, bool quick, const char* target = ">= 50%") {
  const int batch = 16, context = 1024, steps = 30;
  auto model = engine::CudaLlamaModel::createRandom(c,
                                                    {.max_step_tokens = context,
                                                     .max_sequences = batch,
                                                     .max_context = context + steps + 8,
                                                     .random_expert_format = format},
                                                    9);
  check(model.status(), "random MoE model");
  auto shape = engine::cudaMoeShape(c, *engine::planShard(c, {}), {}, format, batch, batch);
  check(shape.status(), "moe shape");
  const double ms = medianDecodeStepMs(**model, c.vocab_size, batch, context, steps);
  int moe_layers = 0;
  for (uint32_t l = 0; l < c.num_layers; ++l) moe_layers += c.isMoeLayer(l) ? 1 : 0;
  const double experts_per_layer =
      expectedTouched(batch, c.moe->experts_per_token, c.moe->num_experts);
  const double routed = static_cast<double>((*model)->routedExpertBytes());
  const double touched = moe_layers * experts_per_layer * engine::moeExpertBytes(*shape);
  // Each sequence's KV positions a layer reads: its context, or its window on a sliding layer
  // (none on a linear-attention layer, which reads and writes the sequence's f32 state).
  const model::KvCacheShape kv_shape = model::kvCacheShape(c);
  double positions = 0;
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    if (c.isLinearLayer(l)) continue;
    const uint32_t window = c.attentionWindow(l);
    positions += window > 0 ? std::min<double>(window, context) : context;
  }
  const double kv = 2.0 * batch * positions * kv_shape.parts * kv_shape.heads * kv_shape.head_dim;
  const double states =
      2.0 * batch * engine::linearStateFloats(c, *engine::planShard(c, {})) * sizeof(float);
  const double floor_ms =
      ((*model)->weightBytes() - routed + touched + kv + states) / (copy_gbs * 1e9) * 1e3;
  char what[160];
  std::snprintf(what, sizeof(what), "decode step %s %s%s b%d ctx%d (floor %.2f ms)", name,
                cuda::expertWeightFormatName(format),
                quick ? fmt(" (%.0f layers)", c.num_layers).c_str() : "", batch, context, floor_ms);
  addRow({what, ms, fmt("%.2f ms", ms), fmt("%.0f%% of floor", 100 * floor_ms / ms), target});
}

// One Gated DeltaNet layer (the convolution and the delta rule, not the projections) of
// Qwen3.5-397B-A17B's shape on one GPU of two (8 key heads, 32 value heads, heads of 128,
// 4 taps): `sequences` sequences of `rows` rows each. A decode step's floor is its states
// read and written once (f32) plus the projection read and the output written, over the
// copy bandwidth; a prefill's is reported as rows per second. A step of a few rows a
// sequence verifies drafts: with `keep_rows` each row but the last also leaves its state in
// a slot of its own (row_slots), whose writes the floor counts.
void gatedDeltaNet(int sequences, int rows, double copy_gbs, int reps, int column_groups = 1,
                   bool keep_rows = false) {
  const int key_heads = 8, value_heads = 32, dk = 128, dv = 128, taps = 4;
  const int64_t kd = int64_t{key_heads} * dk, vd = int64_t{value_heads} * dv;
  const int64_t channels = 2 * kd + vd, proj_dim = channels + vd + 2 * value_heads;
  const int64_t slot_floats =
      key_heads * cuda::gatedDeltaNetGroupFloats(dk, dv, taps, value_heads / key_heads);
  const int64_t tokens = int64_t{sequences} * rows;
  bf16* proj = randomBf16(tokens * proj_dim, 41);
  bf16* out = deviceAlloc<bf16>(tokens * vd);
  float* mixed = deviceAlloc<float>(tokens * channels);
  float* raw = deviceAlloc<float>(tokens * vd);  // a prefill's outputs before the norm
  // Each sequence's slot, then (keep_rows) its rows' slots.
  const int64_t slots = sequences * (keep_rows ? rows : 1);
  float* states = deviceAlloc<float>(slots * slot_floats);
  check(cuda::fillUniform(states, slots * slot_floats, -0.1f, 0.1f, 43, nullptr), "states");
  float* conv = deviceAlloc<float>(channels * taps);
  check(cuda::fillUniform(conv, channels * taps, -0.5f, 0.5f, 44, nullptr), "conv");
  float* per_head = deviceAlloc<float>(2 * value_heads + dv);
  check(cuda::fillUniform(per_head, value_heads, -1.0f, -0.1f, 45, nullptr), "a_rate");
  check(cuda::fillUniform(per_head + value_heads, value_heads + dv, 0.5f, 1.0f, 46, nullptr),
        "dt_bias, norm");
  std::vector<int32_t> meta;  // q_starts, positions, slots, row slots
  for (int q = 0; q <= sequences; ++q) meta.push_back(q * rows);
  for (int64_t t = 0; t < tokens; ++t) meta.push_back(static_cast<int32_t>(100 + t % rows));
  for (int q = 0; q < sequences; ++q) meta.push_back(q);
  for (int64_t t = 0; t < tokens; ++t) {
    const bool last = t % rows == rows - 1;
    meta.push_back(keep_rows && !last ? static_cast<int32_t>(sequences + t - t / rows) : -1);
  }
  int32_t* d_meta = deviceAlloc<int32_t>(meta.size());
  check(cudaMemcpy(d_meta, meta.data(), meta.size() * 4, cudaMemcpyHostToDevice), "meta");
  const cuda::GatedDeltaNetArgs args{
      .proj = proj,
      .proj_stride = proj_dim,
      .mixed = mixed,
      .q_starts = d_meta,
      .positions = d_meta + sequences + 1,
      .state_slots = d_meta + sequences + 1 + tokens,
      .row_slots = keep_rows ? d_meta + 2 * sequences + 1 + tokens : nullptr,
      .states = states,
      .slot_floats = slot_floats,
      .conv = conv,
      .a_rate = per_head,
      .dt_bias = per_head + value_heads,
      .norm = per_head + 2 * value_heads,
      .sequences = sequences,
      .key_heads = key_heads,
      .value_heads = value_heads,
      .key_head_dim = dk,
      .value_head_dim = dv,
      .conv_kernel = taps,
      .out = out,
      .out_stride = vd,
      .column_groups = column_groups,
      .raw = raw,
      .tokens = static_cast<int>(tokens)};
  const double ms =
      medianMs([&](int) { check(cuda::gatedDeltaNet(args, nullptr), "gated delta net"); }, reps);
  char what[160];
  if (rows <= 8) {
    const double bytes = (2.0 + (keep_rows ? rows - 1 : 0)) * sequences * slot_floats * 4 +
                         tokens * (proj_dim + vd) * 2.0 + 2.0 * tokens * channels * 4;
    const double floor_ms = bytes / (copy_gbs * 1e9) * 1e3;
    if (rows == 1) {
      std::snprintf(what, sizeof(what),
                    "Gated DeltaNet layer Qwen3.5 TP2 decode b%d (floor %.3f ms)", sequences,
                    floor_ms);
    } else {
      std::snprintf(what, sizeof(what),
                    "Gated DeltaNet layer Qwen3.5 TP2 verify b%d x %d rows%s (floor %.3f ms)",
                    sequences, rows, keep_rows ? ", row states" : "", floor_ms);
    }
    addRow({what, ms, fmt("%.0f GB/s", bytes / ms / 1e6),
            fmt("%.0f%% of floor", 100 * floor_ms / ms), ""});
  } else {
    std::snprintf(what, sizeof(what),
                  "Gated DeltaNet layer Qwen3.5 TP2 prefill %d x %d rows, %d column group%s",
                  sequences, rows, column_groups, column_groups > 1 ? "s" : "");
    addRow({what, ms, fmt("%.0f rows/s", tokens / ms * 1e3), "", ""});
  }
  for (void* p : {static_cast<void*>(proj), static_cast<void*>(out), static_cast<void*>(mixed),
                  static_cast<void*>(raw), static_cast<void*>(states), static_cast<void*>(conv),
                  static_cast<void*>(per_head), static_cast<void*>(d_meta)})
    cudaFree(p);
}

// Qwen3-Next-80B-A3B's config.json (transformers' defaults, as published): three Gated
// DeltaNet layers to one gated-attention layer with heads of 256, 512 experts of which 10 a
// token, a gated shared expert.
model::ModelConfig qwen3NextShape(int layers) {
  const std::string json =
      R"({"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"],
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": )" +
      std::to_string(layers) + R"(, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000000,
    "partial_rotary_factor": 0.25, "max_position_embeddings": 262144,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "full_attention_interval": 4,
    "decoder_sparse_step": 1, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10, "num_experts": 512,
    "norm_topk_prob": true, "mlp_only_layers": [], "tie_word_embeddings": false})";
  auto c = model::parseConfigJson(json, "Qwen3-Next-80B-A3B shape");
  check(c.status(), "Qwen3-Next config");
  return *c;
}

}  // namespace
}  // namespace cleave

int main(int argc, char** argv) {
  using namespace cleave;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  auto devices = cuda::listDevices();
  if (!devices.ok() || devices->empty()) {
    std::fprintf(stderr, "bench_cuda: no CUDA device\n");
    return 1;
  }
  const cuda::DeviceInfo& d = (*devices)[0];
  std::printf("device: %s, sm_%d%d, %d SMs, %.0f GiB\n", d.name.c_str(), d.sm_major, d.sm_minor,
              d.multiprocessors, d.total_memory_bytes / double(1 << 30));
  const int reps = quick ? 5 : 20;
  const int sms = d.multiprocessors;
  auto gemm = cuda::Gemm::create();
  if (!gemm.ok()) {
    std::fprintf(stderr, "bench_cuda: cuBLASLt: %s\n", gemm.status().ToString().c_str());
    return 1;
  }
  std::printf("\n%-66s %10s %16s %14s %8s\n", "benchmark", "median ms", "achieved", "of ceiling",
              "target");
  double copy = 0, peak = 0;
  attempt("copy", [&] { copy = copyBandwidth(reps); });
  attempt("matmul", [&] { peak = matmulPeak(**gemm, reps); });
  if (copy <= 0 || peak <= 0) return 1;  // Every other row is a fraction of these.
  const AttentionShape decode_shapes[] = {
      {32, 4096, 32, 8, 128, 16},
      {32, 4096, 32, 8, 128, 64},
      {1, 4096, 32, 8, 128, 16},
      {64, 1024, 32, 8, 128, 16},
      {16, 2048, 32, 4, 64, 16},
      {32, 4096, 32, 8, 128, 16, cuda::KvDtype::kFp8E4M3},
      // Heads of 256 (Qwen3.5, Qwen3-Next): each of the head's two blocks reads all of K, so
      // its rate against the cache's bytes is at most 2/3 of the copy.
      {32, 4096, 16, 2, 256, 16}};
  for (const AttentionShape& a : decode_shapes) {
    const bool target = &a == &decode_shapes[0];
    attempt("decode attention",
            [&] { decodeAttention(a, copy, sms, reps, target ? ">= 85%" : ""); });
  }
  // DeepSeek-V3 per GPU at TP 8 (16 heads) and on one GPU (128 heads).
  struct MlaShape {
    int batch, heads;
    cuda::KvDtype kv;
  };
  const MlaShape mla_shapes[] = {{32, 16, cuda::KvDtype::kBf16},
                                 {1, 16, cuda::KvDtype::kBf16},
                                 {32, 128, cuda::KvDtype::kBf16},
                                 {32, 16, cuda::KvDtype::kFp8E4M3}};
  for (const MlaShape& m : mla_shapes)
    attempt("latent attention",
            [&] { mlaDecodeAttention(m.batch, 4096, m.heads, m.kv, copy, sms, reps); });
  attempt("prefill attention", [&] { prefillAttention(4096, peak, reps); });
  attempt("prefill attention", [&] { prefillAttention(1024, peak, reps); });
  attempt("decode step", [&] { decodeStep(copy, quick); });
  attempt("skinny GEMM", [&] { skinnyGemm(copy, reps, **gemm); });
  for (cuda::ExpertWeightFormat f :
       {cuda::ExpertWeightFormat::kBf16, cuda::ExpertWeightFormat::kNvfp4,
        cuda::ExpertWeightFormat::kFp8Block128}) {
    attempt("MoE layer", [&] { moeLayer(copy, f, reps, **gemm); });
    attempt("MoE decode step",
            [&] { moeDecodeStep("Qwen3-30B-A3B", qwen3MoeShape(quick ? 8 : 48), copy, f, quick); });
  }
  attempt("MoE decode step", [&] {
    moeDecodeStep("DeepSeek-V2-Lite", deepseekV2LiteShape(quick ? 8 : 27), copy,
                  cuda::ExpertWeightFormat::kBf16, quick);
  });
  attempt("MoE decode step", [&] {
    moeDecodeStep("gpt-oss-120b", gptOss120bShape(quick ? 6 : 36), copy,
                  cuda::ExpertWeightFormat::kNvfp4, quick, "");
  });
  attempt("MoE decode step", [&] {
    moeDecodeStep("Qwen3-Next-80B-A3B", qwen3NextShape(quick ? 8 : 48), copy,
                  cuda::ExpertWeightFormat::kNvfp4, quick, "");
  });
  attempt("Gated DeltaNet", [&] { gatedDeltaNet(16, 1, copy, reps); });
  // Drafts verified (3 a sequence), without and with the states after their rows kept.
  attempt("Gated DeltaNet", [&] { gatedDeltaNet(16, 4, copy, reps); });
  attempt("Gated DeltaNet", [&] { gatedDeltaNet(16, 4, copy, reps, 1, true); });
  // A prefill with a block a head, then split as the model runs it.
  attempt("Gated DeltaNet", [&] { gatedDeltaNet(1, 4096, copy, quick ? 2 : 5); });
  attempt("Gated DeltaNet", [&] {
    gatedDeltaNet(1, 4096, copy, quick ? 2 : 5, cuda::gatedDeltaNetColumnGroups(128, 128));
  });
  // Last: NCCL's set-up is what may hang on a machine without working peer access.
  attempt("all-reduce", [&] { allReduce(reps); });
  std::printf("\n%-66s %10s %16s %14s %8s\n", "benchmark", "median ms", "achieved", "of ceiling",
              "target");
  for (const Row& r : rows) printRow(r);
  return 0;
}
