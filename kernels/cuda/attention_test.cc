// Decode, prefill and latent attention on the GPU against the CPU backend's attention
// (kernels/cpu/attention.h) on the same bf16 inputs, over awkward context lengths, page
// sizes, head dims, GQA groups and cache types (bf16, e4m3 with per-tensor scales). bf16 tolerance:
// relative L2 error <= 1e-2 (P is rounded to bf16 before P·V, the output is bf16), no NaN, every
// output written.
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/mla_attention.h"
#include "kernels/cuda/prefill_attention.h"

namespace cleave::cuda {
namespace {

using testing::bf16;
using testing::DeviceBuffer;

struct Case {
  int head_dim;
  int block_size;
  int kv_heads;
  int group;
  std::vector<int> context;          // per sequence
  std::vector<int> new_tokens = {};  // prefill only: how many of the context are new
  KvDtype kv = KvDtype::kBf16;
  int window = 0;      // sliding window (positions, the token's own included); 0: none
  bool sinks = false;  // a sink logit per head (gpt-oss)
  float softcap = 0;   // scores capped to ±softcap (Gemma 2); 0: none
};

// A sink logit per head, in [-2, 4): some heads' sinks outweigh every score, some do not.
std::vector<float> randomSinks(int heads, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-2.0f, 4.0f);
  std::vector<float> sinks(heads);
  for (float& v : sinks) v = dist(rng);
  return sinks;
}

// Scales of the e4m3 cases: values in [-1, 1) stored as value / scale.
constexpr float kKScale = 0.07f, kVScale = 0.05f;

// A paged cache holding every sequence's context in shuffled blocks: the bytes the GPU
// reads (bf16, or e4m3 with kKScale / kVScale) and the values they stand for.
struct PagedCache {
  int max_blocks_per_seq = 0;
  std::vector<int32_t> tables;            // [seqs][max_blocks_per_seq]
  std::vector<uint8_t> k_bytes, v_bytes;  // [blocks][kv_heads][block_size][head_dim]
  std::vector<float> k, v;                // what they hold
};

void fillCache(KvDtype kv, float scale, size_t elements, std::mt19937& rng,
               std::vector<uint8_t>& bytes, std::vector<float>& values) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  values.resize(elements);
  if (kv == KvDtype::kBf16) {
    std::vector<bf16> stored = testing::randomBf16(elements, rng);
    values = testing::toFloat(stored);
    bytes.assign(reinterpret_cast<uint8_t*>(stored.data()),
                 reinterpret_cast<uint8_t*>(stored.data() + elements));
    return;
  }
  bytes.resize(elements);
  for (size_t i = 0; i < elements; ++i) {
    bytes[i] = __nv_cvt_float_to_fp8(dist(rng) / scale, __NV_SATFINITE, __NV_E4M3);
    const __half_raw h = __nv_cvt_fp8_to_halfraw(bytes[i], __NV_E4M3);
    values[i] = __half2float(__half(h)) * scale;
  }
}

PagedCache makeCache(const Case& c, std::mt19937& rng) {
  PagedCache cache;
  int total = 0;
  for (int len : c.context) {
    const int blocks = (len + c.block_size - 1) / c.block_size;
    cache.max_blocks_per_seq = std::max(cache.max_blocks_per_seq, blocks);
    total += blocks;
  }
  total += 3;  // Blocks no sequence owns.
  std::vector<int32_t> order(total);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  cache.tables.assign(c.context.size() * cache.max_blocks_per_seq, -1);
  int next = 0;
  for (size_t s = 0; s < c.context.size(); ++s)
    for (int b = 0; b < (c.context[s] + c.block_size - 1) / c.block_size; ++b)
      cache.tables[s * cache.max_blocks_per_seq + b] = order[next++];
  const size_t elements = static_cast<size_t>(total) * c.kv_heads * c.block_size * c.head_dim;
  fillCache(c.kv, kKScale, elements, rng, cache.k_bytes, cache.k);
  fillCache(c.kv, kVScale, elements, rng, cache.v_bytes, cache.v);
  return cache;
}

// The CPU backend's attention of `tokens` query rows; row t belongs to sequence seq_of[t]
// and sits at position positions[t].
std::vector<float> cpuReference(const Case& c, const PagedCache& cache, const std::vector<bf16>& q,
                                const std::vector<int>& seq_of,
                                const std::vector<int32_t>& positions,
                                const std::vector<float>& sinks) {
  const int heads = c.kv_heads * c.group;
  std::vector<float> qf = testing::toFloat(q);
  std::vector<const int32_t*> tables;
  for (int s : seq_of) tables.push_back(cache.tables.data() + s * cache.max_blocks_per_seq);
  const int64_t tokens = static_cast<int64_t>(seq_of.size());
  std::vector<float> out(tokens * heads * c.head_dim);
  cpu::ThreadPool pool(2);
  cpu::attention({.q = qf.data(),
                  .ldq = heads * c.head_dim,
                  .tokens = tokens,
                  .positions = positions.data(),
                  .block_tables = tables.data(),
                  .k_pool = cache.k.data(),
                  .v_pool = cache.v.data(),
                  .block_size = c.block_size,
                  .heads = heads,
                  .kv_heads = c.kv_heads,
                  .head_dim = c.head_dim,
                  .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                  .sinks = c.sinks ? sinks.data() : nullptr,
                  .softcap = c.softcap,
                  .window = c.window,
                  .out = out.data(),
                  .ldo = heads * c.head_dim},
                 pool);
  return out;
}

std::string describe(const Case& c) {
  std::string s =
      "head_dim " + std::to_string(c.head_dim) + ", block " + std::to_string(c.block_size) +
      ", kv_heads " + std::to_string(c.kv_heads) + ", group " + std::to_string(c.group) +
      (c.kv == KvDtype::kFp8E4M3 ? ", e4m3" : ", bf16") +
      (c.window ? ", window " + std::to_string(c.window) : "") + (c.sinks ? ", sinks" : "") +
      (c.softcap > 0 ? ", soft cap " + std::to_string(c.softcap) : "") + ", contexts";
  for (int len : c.context) s += " " + std::to_string(len);
  return s;
}

int multiprocessors() {
  auto devices = listDevices();
  return devices.ok() && !devices->empty() ? (*devices)[0].multiprocessors : 1;
}

// Waits for the GPU, then compares its bf16 output with the reference: every element
// written, no NaN, relative L2 error within bf16's tolerance.
void expectClose(const DeviceBuffer<bf16>& out, const std::vector<float>& want) {
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const testing::Difference d = testing::compare(testing::toFloat(out.copyToHost()), want);
  EXPECT_EQ(d.non_finite, 0) << "unwritten or NaN outputs";
  EXPECT_LE(d.relative_l2, 1e-2);
}

void checkDecode(const Case& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  const int heads = c.kv_heads * c.group;
  const int batch = static_cast<int>(c.context.size());
  PagedCache cache = makeCache(c, rng);
  std::vector<bf16> q = testing::randomBf16(static_cast<size_t>(batch) * heads * c.head_dim, rng);
  std::vector<int> seq_of(batch);
  std::iota(seq_of.begin(), seq_of.end(), 0);
  std::vector<int32_t> positions(batch);
  for (int b = 0; b < batch; ++b) positions[b] = c.context[b] - 1;
  const std::vector<float> sinks = randomSinks(heads, rng);
  const std::vector<float> want = cpuReference(c, cache, q, seq_of, positions, sinks);

  auto plan =
      planDecodeAttention({.heads = heads,
                           .kv_heads = c.kv_heads,
                           .head_dim = c.head_dim,
                           .block_size = c.block_size,
                           .max_batch = batch,
                           .max_context = *std::max_element(c.context.begin(), c.context.end()),
                           .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                           .kv_dtype = c.kv,
                           .window = c.window,
                           .softcap = c.softcap},
                          multiprocessors());
  ASSERT_TRUE(plan.ok()) << plan.status();
  DeviceBuffer<bf16> dq(q), dout(q.size());
  DeviceBuffer<uint8_t> dk(cache.k_bytes), dv(cache.v_bytes);
  DeviceBuffer<int32_t> dtables(cache.tables),
      dlens(std::vector<int32_t>(c.context.begin(), c.context.end()));
  DeviceBuffer<uint8_t> workspace(std::max<size_t>(plan->workspace_bytes, 1));
  DeviceBuffer<float> dsinks(sinks);
  absl::Status run = runDecodeAttention(*plan,
                                        {.q = dq.get(),
                                         .q_stride = heads * c.head_dim,
                                         .k_cache = dk.get(),
                                         .v_cache = dv.get(),
                                         .k_scale = c.kv == KvDtype::kFp8E4M3 ? kKScale : 1.0f,
                                         .v_scale = c.kv == KvDtype::kFp8E4M3 ? kVScale : 1.0f,
                                         .block_tables = dtables.get(),
                                         .max_blocks_per_seq = cache.max_blocks_per_seq,
                                         .seq_lens = dlens.get(),
                                         .batch = batch,
                                         .sinks = c.sinks ? dsinks.get() : nullptr,
                                         .out = dout.get(),
                                         .out_stride = heads * c.head_dim,
                                         .workspace = workspace.get()},
                                        nullptr);
  ASSERT_TRUE(run.ok()) << run;
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const testing::Difference d = testing::compare(testing::toFloat(dout.copyToHost()), want);
  EXPECT_EQ(d.non_finite, 0) << "unwritten or NaN outputs (partitions " << plan->partitions << ")";
  EXPECT_LE(d.relative_l2, 1e-2) << "partitions " << plan->partitions;
}

TEST(DecodeAttentionTest, MatchesCpuBackend) {
  CLEAVE_REQUIRE_GPU();
  const uint32_t seed = testing::freshSeed();
  const std::vector<Case> cases = {
      {.head_dim = 64, .block_size = 16, .kv_heads = 3, .group = 3, .context = {1, 54, 97}},
      {.head_dim = 128, .block_size = 16, .kv_heads = 8, .group = 4, .context = {1, 54, 97, 4133}},
      {.head_dim = 128, .block_size = 64, .kv_heads = 2, .group = 8, .context = {200, 65, 4096}},
      {.head_dim = 128, .block_size = 32, .kv_heads = 1, .group = 1, .context = {17, 1000}},
      {.head_dim = 64, .block_size = 64, .kv_heads = 1, .group = 20, .context = {300, 5}},
      {.head_dim = 16, .block_size = 16, .kv_heads = 2, .group = 2, .context = {1, 54, 97}},
      {.head_dim = 32, .block_size = 16, .kv_heads = 1, .group = 4, .context = {300, 17}},
      // The ends of a worker's --block-size range: pages smaller and larger than a key tile.
      {.head_dim = 128, .block_size = 8, .kv_heads = 2, .group = 4, .context = {1, 9, 700}},
      {.head_dim = 64, .block_size = 256, .kv_heads = 2, .group = 4, .context = {300, 1, 513}},
      {.head_dim = 128,
       .block_size = 16,
       .kv_heads = 8,
       .group = 4,
       .context = {1, 97, 4133},
       .kv = KvDtype::kFp8E4M3},
      {.head_dim = 64,
       .block_size = 64,
       .kv_heads = 2,
       .group = 3,
       .context = {54, 700},
       .kv = KvDtype::kFp8E4M3},
      {.head_dim = 128,
       .block_size = 16,
       .kv_heads = 4,
       .group = 2,
       .context = std::vector<int>(64, 129)},
      // gpt-oss: sliding windows (contexts inside, at and past them) and attention sinks, alone
      // and together; windows long enough to be split into partitions, with and without sinks.
      {.head_dim = 64,
       .block_size = 16,
       .kv_heads = 2,
       .group = 4,
       .context = {1, 54, 128, 129, 300, 4133},
       .window = 128},
      {.head_dim = 64,
       .block_size = 16,
       .kv_heads = 2,
       .group = 4,
       .context = {1, 54, 300, 4133},
       .sinks = true},
      {.head_dim = 64,
       .block_size = 64,
       .kv_heads = 1,
       .group = 8,
       .context = {3, 5, 97, 2000},
       .window = 4,
       .sinks = true},
      {.head_dim = 128,
       .block_size = 16,
       .kv_heads = 2,
       .group = 2,
       .context = {70, 5000},
       .kv = KvDtype::kFp8E4M3,
       .window = 1000,
       .sinks = true},
      {.head_dim = 128,
       .block_size = 32,
       .kv_heads = 4,
       .group = 2,
       .context = {999, 1000, 1001, 4133},
       .window = 1000},
      // Gemma 2: soft-capped scores (a cap that binds: the random scores reach about ±1), with
      // and without its window on every other layer, split into partitions, e4m3 too.
      {.head_dim = 128,
       .block_size = 16,
       .kv_heads = 2,
       .group = 2,
       .context = {1, 54, 300, 4133},
       .softcap = 0.25f},
      {.head_dim = 64,
       .block_size = 16,
       .kv_heads = 2,
       .group = 4,
       .context = {3, 129, 4133},
       .kv = KvDtype::kFp8E4M3,
       .window = 128,
       .softcap = 0.25f},
      // Heads of 256 (Gemma 3, Qwen3.5, Qwen3-Next): two blocks a head, each with half of the
      // values; split into partitions, Qwen3.5's group of 16 (one q tile) and a group of 24
      // (two) with sinks, e4m3, a window split into partitions with soft caps.
      {.head_dim = 256, .block_size = 16, .kv_heads = 2, .group = 4, .context = {1, 54, 97, 4133}},
      {.head_dim = 256, .block_size = 64, .kv_heads = 1, .group = 16, .context = {300, 2000}},
      {.head_dim = 256,
       .block_size = 16,
       .kv_heads = 1,
       .group = 24,
       .context = {5, 700, 3000},
       .sinks = true},
      {.head_dim = 256,
       .block_size = 16,
       .kv_heads = 2,
       .group = 2,
       .context = {1, 97, 4133},
       .kv = KvDtype::kFp8E4M3},
      {.head_dim = 256,
       .block_size = 32,
       .kv_heads = 2,
       .group = 4,
       .context = {3, 129, 2000, 4133},
       .window = 1500,
       .softcap = 0.25f},
  };
  for (const Case& c : cases) checkDecode(c, seed);
}

TEST(DecodeAttentionTest, PlanRefusesUnsupportedShapes) {
  const DecodeAttentionShape good{.heads = 8,
                                  .kv_heads = 8,
                                  .head_dim = 64,
                                  .block_size = 16,
                                  .max_batch = 1,
                                  .max_context = 16,
                                  .scale = 1};
  DecodeAttentionShape head_dim = good, block = good, heads = good, window = good;
  head_dim.head_dim = 96;
  block.block_size = 24;
  heads.heads = 6;
  heads.kv_heads = 4;
  window.window = -1;
  for (const DecodeAttentionShape& bad : {head_dim, block, heads, window})
    EXPECT_EQ(planDecodeAttention(bad, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

void checkPrefill(const Case& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  const int heads = c.kv_heads * c.group;
  const int sequences = static_cast<int>(c.context.size());
  PagedCache cache = makeCache(c, rng);
  std::vector<int32_t> q_starts = {0};
  std::vector<int> seq_of;
  std::vector<int32_t> positions;
  for (int s = 0; s < sequences; ++s) {
    const int fresh = c.new_tokens[s];
    q_starts.push_back(q_starts.back() + fresh);
    for (int i = 0; i < fresh; ++i) {
      seq_of.push_back(s);
      positions.push_back(c.context[s] - fresh + i);
    }
  }
  const int tokens = q_starts.back();
  std::vector<bf16> q = testing::randomBf16(static_cast<size_t>(tokens) * heads * c.head_dim, rng);
  const std::vector<float> sinks = randomSinks(heads, rng);
  const std::vector<float> want = cpuReference(c, cache, q, seq_of, positions, sinks);

  auto plan = planPrefillAttention(
      {.heads = heads,
       .kv_heads = c.kv_heads,
       .head_dim = c.head_dim,
       .block_size = c.block_size,
       .max_sequences = sequences,
       .max_new_tokens = *std::max_element(c.new_tokens.begin(), c.new_tokens.end()),
       .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
       .kv_dtype = c.kv,
       .window = c.window,
       .softcap = c.softcap});
  ASSERT_TRUE(plan.ok()) << plan.status();
  DeviceBuffer<bf16> dq(q), dout(q.size());
  DeviceBuffer<float> dsinks(sinks);
  DeviceBuffer<uint8_t> dk(cache.k_bytes), dv(cache.v_bytes);
  DeviceBuffer<int32_t> dtables(cache.tables), dstarts(q_starts),
      dcontext(std::vector<int32_t>(c.context.begin(), c.context.end()));
  absl::Status run = runPrefillAttention(*plan,
                                         {.q = dq.get(),
                                          .q_stride = heads * c.head_dim,
                                          .k_cache = dk.get(),
                                          .v_cache = dv.get(),
                                          .k_scale = c.kv == KvDtype::kFp8E4M3 ? kKScale : 1.0f,
                                          .v_scale = c.kv == KvDtype::kFp8E4M3 ? kVScale : 1.0f,
                                          .block_tables = dtables.get(),
                                          .max_blocks_per_seq = cache.max_blocks_per_seq,
                                          .q_starts = dstarts.get(),
                                          .context_lens = dcontext.get(),
                                          .sequences = sequences,
                                          .sinks = c.sinks ? dsinks.get() : nullptr,
                                          .out = dout.get(),
                                          .out_stride = heads * c.head_dim},
                                         nullptr);
  ASSERT_TRUE(run.ok()) << run;
  expectClose(dout, want);
}

TEST(PrefillAttentionTest, MatchesCpuBackendWithCachedPrefixes) {
  CLEAVE_REQUIRE_GPU();
  const uint32_t seed = testing::freshSeed();
  const std::vector<Case> cases = {
      // Whole prompts.
      {.head_dim = 64,
       .block_size = 16,
       .kv_heads = 3,
       .group = 3,
       .context = {1, 54, 97},
       .new_tokens = {1, 54, 97}},
      // Heads of 256: two blocks a head, keys in stages of 32; over cached prefixes, e4m3.
      {.head_dim = 256,
       .block_size = 16,
       .kv_heads = 2,
       .group = 4,
       .context = {70, 300, 129},
       .new_tokens = {33, 300, 1}},
      {.head_dim = 256,
       .block_size = 64,
       .kv_heads = 1,
       .group = 16,
       .context = {1000, 65},
       .new_tokens = {200, 65},
       .kv = KvDtype::kFp8E4M3},
      {.head_dim = 256,
       .block_size = 32,
       .kv_heads = 2,
       .group = 2,
       .context = {400, 90},
       .new_tokens = {150, 90},
       .window = 100,
       .softcap = 0.25f},
      // Chunks over cached prefixes, one sequence longer than a 64-row tile several times.
      {.head_dim = 128,
       .block_size = 16,
       .kv_heads = 2,
       .group = 4,
       .context = {70, 300, 129},
       .new_tokens = {33, 300, 1}},
      {.head_dim = 128,
       .block_size = 64,
       .kv_heads = 1,
       .group = 8,
       .context = {4100, 65},
       .new_tokens = {512, 64}},
      {.head_dim = 64,
       .block_size = 32,
       .kv_heads = 4,
       .group = 1,
       .context = {17, 200},
       .new_tokens = {17, 135}},
      // The ends of a worker's --block-size range: pages smaller and larger than a key tile.
      {.head_dim = 128,
       .block_size = 8,
       .kv_heads = 2,
       .group = 4,
       .context = {70, 300},
       .new_tokens = {33, 300}},
      {.head_dim = 64,
       .block_size = 256,
       .kv_heads = 2,
       .group = 4,
       .context = {600, 129},
       .new_tokens = {100, 129}},
      // Small heads.
      {.head_dim = 16,
       .block_size = 16,
       .kv_heads = 2,
       .group = 2,
       .context = {54, 97},
       .new_tokens = {54, 40}},
      {.head_dim = 32,
       .block_size = 16,
       .kv_heads = 1,
       .group = 4,
       .context = {130},
       .new_tokens = {129}},
      // An e4m3 cache.
      {.head_dim = 128,
       .block_size = 16,
       .kv_heads = 2,
       .group = 4,
       .context = {70, 300},
       .new_tokens = {33, 300},
       .kv = KvDtype::kFp8E4M3},
      // gpt-oss: sliding windows shorter than a key tile and longer, over cached prefixes,
      // and attention sinks.
      {.head_dim = 64,
       .block_size = 16,
       .kv_heads = 2,
       .group = 4,
       .context = {70, 300, 129},
       .new_tokens = {70, 200, 1},
       .window = 4},
      {.head_dim = 64,
       .block_size = 16,
       .kv_heads = 2,
       .group = 4,
       .context = {300, 700},
       .new_tokens = {300, 129},
       .window = 128,
       .sinks = true},
      {.head_dim = 64,
       .block_size = 32,
       .kv_heads = 1,
       .group = 8,
       .context = {54, 200},
       .new_tokens = {54, 135},
       .sinks = true},
      {.head_dim = 128,
       .block_size = 16,
       .kv_heads = 2,
       .group = 4,
       .context = {70, 300},
       .new_tokens = {33, 300},
       .kv = KvDtype::kFp8E4M3,
       .window = 100,
       .sinks = true},
      // Gemma 2: soft-capped scores, over a cached prefix, with a window too.
      {.head_dim = 128,
       .block_size = 16,
       .kv_heads = 2,
       .group = 2,
       .context = {70, 300},
       .new_tokens = {70, 129},
       .softcap = 0.25f},
      {.head_dim = 64,
       .block_size = 16,
       .kv_heads = 2,
       .group = 4,
       .context = {300},
       .new_tokens = {200},
       .window = 64,
       .softcap = 0.25f},
  };
  for (const Case& c : cases) checkPrefill(c, seed);
}

TEST(PrefillAttentionTest, PlanRefusesANegativeWindow) {
  auto plan = planPrefillAttention({.heads = 8,
                                    .kv_heads = 8,
                                    .head_dim = 64,
                                    .block_size = 16,
                                    .max_sequences = 1,
                                    .max_new_tokens = 16,
                                    .scale = 1,
                                    .window = -1});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
}

// Latent attention (absorbed form): every head attends over one cached head of
// kv_lora + rope elements whose first kv_lora are the values. The reference is the CPU
// backend's attention with that one head as keys and values, cut to kv_lora.
struct MlaCase {
  int heads;
  int kv_lora;
  int rope;
  int block_size;
  std::vector<int> context;          // per sequence
  std::vector<int> new_tokens = {};  // query tokens at the end of each context (default 1)
  KvDtype kv = KvDtype::kBf16;
};

void checkMla(const MlaCase& c, uint32_t seed) {
  const int row = c.kv_lora + c.rope;
  std::string what = "heads " + std::to_string(c.heads) + ", latent " + std::to_string(c.kv_lora) +
                     " + " + std::to_string(c.rope) +
                     (c.kv == KvDtype::kFp8E4M3 ? ", e4m3" : ", bf16") + ", contexts";
  for (int len : c.context) what += " " + std::to_string(len);
  SCOPED_TRACE(what);
  std::mt19937 rng(seed);
  const PagedCache cache = makeCache({.head_dim = row,
                                      .block_size = c.block_size,
                                      .kv_heads = 1,
                                      .group = 1,
                                      .context = c.context,
                                      .kv = c.kv},
                                     rng);
  std::vector<int32_t> positions, q_starts = {0};
  std::vector<const int32_t*> tables;
  for (size_t s = 0; s < c.context.size(); ++s) {
    const int n = c.new_tokens.empty() ? 1 : c.new_tokens[s];
    for (int i = 0; i < n; ++i) {
      positions.push_back(c.context[s] - n + i);
      tables.push_back(cache.tables.data() + s * cache.max_blocks_per_seq);
    }
    q_starts.push_back(static_cast<int32_t>(positions.size()));
  }
  const int64_t tokens = static_cast<int64_t>(positions.size());
  const float scale = 1.0f / std::sqrt(192.0f);
  std::vector<bf16> q = testing::randomBf16(static_cast<size_t>(tokens) * c.heads * row, rng);
  const std::vector<float> qf = testing::toFloat(q);
  std::vector<float> full(static_cast<size_t>(tokens) * c.heads * row);
  cpu::ThreadPool pool(2);
  cpu::attention({.q = qf.data(),
                  .ldq = c.heads * row,
                  .tokens = tokens,
                  .positions = positions.data(),
                  .block_tables = tables.data(),
                  .k_pool = cache.k.data(),
                  .v_pool = cache.k.data(),
                  .block_size = c.block_size,
                  .heads = c.heads,
                  .kv_heads = 1,
                  .head_dim = row,
                  .scale = scale,
                  .out = full.data(),
                  .ldo = c.heads * row},
                 pool);
  std::vector<float> want;
  for (int64_t i = 0; i < tokens * c.heads; ++i)
    want.insert(want.end(), full.begin() + i * row, full.begin() + i * row + c.kv_lora);

  auto plan =
      planMlaAttention({.heads = c.heads,
                        .kv_lora = c.kv_lora,
                        .rope = c.rope,
                        .block_size = c.block_size,
                        .max_tokens = static_cast<int>(tokens),
                        .max_context = *std::max_element(c.context.begin(), c.context.end()),
                        .kv_dtype = c.kv},
                       multiprocessors());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tensor_cores, c.kv_lora == 512 && c.rope == 64);
  DeviceBuffer<bf16> dq(q), dout(want.size());
  DeviceBuffer<uint8_t> dcache(cache.k_bytes);
  DeviceBuffer<int32_t> dtables(cache.tables), dpositions(positions), dstarts(q_starts);
  DeviceBuffer<uint8_t> workspace(std::max<size_t>(plan->workspace_bytes, 1));
  absl::Status run = mlaAttention(*plan,
                                  {.q = dq.get(),
                                   .q_stride = c.heads * row,
                                   .cache = dcache.get(),
                                   .kv_dtype = c.kv,
                                   .kv_scale = c.kv == KvDtype::kFp8E4M3 ? kKScale : 1.0f,
                                   .positions = dpositions.get(),
                                   .q_starts = dstarts.get(),
                                   .block_tables = dtables.get(),
                                   .max_blocks_per_seq = cache.max_blocks_per_seq,
                                   .sequences = static_cast<int>(c.context.size()),
                                   .tokens = tokens,
                                   .heads = c.heads,
                                   .kv_lora = c.kv_lora,
                                   .rope = c.rope,
                                   .block_size = c.block_size,
                                   .scale = scale,
                                   .out = dout.get(),
                                   .out_stride = c.heads * c.kv_lora,
                                   .workspace = workspace.get()},
                                  nullptr);
  ASSERT_TRUE(run.ok()) << run;
  expectClose(dout, want);
}

TEST(MlaAttentionTest, MatchesCpuBackend) {
  CLEAVE_REQUIRE_GPU();
  const uint32_t seed = testing::freshSeed();
  const std::vector<MlaCase> cases = {
      // DeepSeek's latent, on the tensor cores: decode with the context split, many heads, a
      // partial head group and an e4m3 cache (whole and split), a full batch, prefill chunks
      // over cached prefixes.
      {.heads = 16, .kv_lora = 512, .rope = 64, .block_size = 16, .context = {1, 54, 97, 4133}},
      {.heads = 128, .kv_lora = 512, .rope = 64, .block_size = 64, .context = {300, 4096}},
      {.heads = 20,
       .kv_lora = 512,
       .rope = 64,
       .block_size = 16,
       .context = {97, 1},
       .kv = KvDtype::kFp8E4M3},
      {.heads = 20,
       .kv_lora = 512,
       .rope = 64,
       .block_size = 64,
       .context = {300, 1},
       .kv = KvDtype::kFp8E4M3},
      {.heads = 16,
       .kv_lora = 512,
       .rope = 64,
       .block_size = 16,
       .context = std::vector<int>(64, 129)},
      {.heads = 16,
       .kv_lora = 512,
       .rope = 64,
       .block_size = 16,
       .context = {200, 37},
       .new_tokens = {45, 37}},
      // Other latents, on CUDA cores (the tiny test models').
      {.heads = 4, .kv_lora = 16, .rope = 8, .block_size = 16, .context = {1, 54, 97}},
      {.heads = 8,
       .kv_lora = 64,
       .rope = 16,
       .block_size = 16,
       .context = {54, 300},
       .new_tokens = {3, 2},
       .kv = KvDtype::kFp8E4M3},
  };
  for (const MlaCase& c : cases) checkMla(c, seed);
}

TEST(MlaAttentionTest, PlanRefusesUnsupportedShapes) {
  const MlaAttentionShape good{.heads = 16, .kv_lora = 16, .rope = 8, .max_context = 64};
  MlaAttentionShape block = good, rope = good, tokens = good, wide = good;
  block.block_size = 24;
  rope.rope = -1;
  tokens.max_tokens = 0;
  wide.kv_lora = 8192;  // Not DeepSeek's 512 + 64: the CUDA-core kernel, whose row this passes.
  for (const MlaAttentionShape& bad : {block, rope, tokens, wide})
    EXPECT_EQ(planMlaAttention(bad, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave::cuda
