// The CUDA model against the CPU model (llama_model.h) on the same weights: the real
// SmolLM2 file (Q4_1, converted to bf16 at load) and the tiny random-weight Hugging Face
// models of every architecture, dense and mixture-of-experts. A batch of prompts of different
// lengths is prefilled together, then decoded together step by step through the CUDA graphs; every
// step's logits are compared.
//
// bf16 tolerance: relative L2 error of each sequence's logits <= 5e-2 (weights, the
// residual stream and the KV cache are bf16 on the GPU, f32 on the CPU), and the same
// greedy token wherever the CPU's top two logits are not a near-tie.
#include "services/engine/cuda_llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/model/model_config.h"
#include "kernels/cuda/cuda_test_util.h"
#include "services/engine/cuda_weights.h"
#include "services/engine/kv_storage.h"
#include "services/engine/llama_model.h"
#include "services/engine/llama_weights.h"
#include "services/engine/sampler.h"
#include "services/engine/tp_group.h"

namespace cleave::engine {
namespace {

// Data folders: the compiled-in source tree, or the environment's (scripts/device-check.sh
// runs these tests from a folder copied to a GPU machine).
std::string goldenDir() {
  const char* dir = std::getenv("CLEAVE_GOLDEN_DIR");
  return dir ? dir : CLEAVE_GOLDEN_DIR;
}
std::string modelDir() {
  const char* dir = std::getenv("CLEAVE_MODEL_DIR");
  return dir ? dir : CLEAVE_MODEL_DIR;
}

struct Comparison {
  double worst_relative = 0;
  int greedy_checked = 0;
  int greedy_same = 0;
};

void compareLogits(std::span<const float> got, std::span<const float> want, int64_t vocab,
                   Comparison& c) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size() / vocab; ++s) {
    double err = 0, norm = 0;
    const float* g = got.data() + s * vocab;
    const float* w = want.data() + s * vocab;
    for (int64_t v = 0; v < vocab; ++v) {
      ASSERT_TRUE(std::isfinite(g[v])) << "sequence " << s << " logit " << v;
      err += (double(g[v]) - w[v]) * (double(g[v]) - w[v]);
      norm += double(w[v]) * w[v];
    }
    c.worst_relative = std::max(c.worst_relative, std::sqrt(err / norm));
    std::vector<int64_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                      [&](int64_t a, int64_t b) { return w[a] > w[b]; });
    // A near-tie is a gap under a tenth of the logits' RMS: ~5x the expected bf16 error.
    if (w[order[0]] - w[order[1]] > 0.1 * std::sqrt(norm / vocab)) {
      ++c.greedy_checked;
      c.greedy_same += std::max_element(g, g + vocab) - g == order[0];
    }
  }
}

// Quantized weights widened to bf16 unless `operands` says otherwise, so the bounds hold on
// every device. The CPU reference keeps the weights as stored (TpShard::cpu_kernels false):
// NVFP4 and FP8 multiply float activations there, not the int8 kernels' rounded ones.
void checkModel(const std::string& path, cuda::KvDtype kv = cuda::KvDtype::kBf16,
                double tolerance = 5e-2, double min_greedy_fraction = 1.0,
                cuda::GemmOperands operands = cuda::GemmOperands::kWidened) {
  auto weights = loadLlama(path, {.cpu_kernels = false});
  ASSERT_TRUE(weights.ok()) << weights.status();
  const LlamaWeights& w = **weights;
  const int64_t vocab = w.config.vocab_size;
  // Linear-attention models: each sequence's state in a slot (the last ones of four).
  const bool linear = w.config.linear_attention.has_value();
  auto gpu = CudaLlamaModel::create(w, {.max_step_tokens = 256,
                                        .max_sequences = 4,
                                        .max_context = 256,
                                        .state_slots = 4,
                                        .kv_dtype = kv,
                                        .operands = operands});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  cpu::ThreadPool pool(2);
  LlamaModel cpu_model(w, pool);
  const model::KvCacheShape shape = model::kvCacheShape(w.config);
  KvStorage cache({.num_layers = w.config.kvLayers(),
                   .kv_heads = w.dims.kv_heads.size,
                   .head_dim = shape.head_dim,
                   .block_size = 16,
                   .num_blocks = (*gpu)->kvBlocks(),
                   .parts = shape.parts,
                   .state_slots = linear ? 4 : 0,
                   .state_floats = linearStateFloats(w.config, w.dims)});

  std::mt19937 rng(cuda::testing::freshSeed());
  std::uniform_int_distribution<uint32_t> token(0, static_cast<uint32_t>(vocab - 1));
  const std::vector<int> lengths = {1, 37, 70};
  std::vector<std::vector<uint32_t>> tokens(lengths.size());
  std::vector<std::vector<int32_t>> blocks(lengths.size());
  // Blocks shuffled across the cache, so the tables are not the identity.
  std::vector<int32_t> free(cache.totalBlocks());
  std::iota(free.begin(), free.end(), 0);
  std::shuffle(free.begin(), free.end(), rng);
  for (size_t s = 0; s < lengths.size(); ++s) {
    for (int i = 0; i < lengths[s]; ++i) tokens[s].push_back(token(rng));
    for (int b = 0; b < 6; ++b) {  // 96 positions: prompt plus the decode steps
      blocks[s].push_back(free.back());
      free.pop_back();
    }
  }
  Comparison c;
  std::vector<SequenceChunk> batch(lengths.size());
  for (size_t s = 0; s < lengths.size(); ++s)
    batch[s] = {.tokens = tokens[s],
                .start = 0,
                .blocks = blocks[s],
                .state = linear ? static_cast<int32_t>(3 - s) : -1};
  for (int step = 0; step < 12; ++step) {
    SCOPED_TRACE(::testing::Message() << path << " step " << step);
    // Linear-attention models, a state checkpoint on both backends: at step 5 the second
    // sequence also leaves its state in the free slot 0 (state_to); its own slot is then
    // poisoned on both, and step 6 starts from a copy of slot 0 (state_from).
    if (linear && step == 5) batch[1].state_to = 0;
    if (linear && step == 6) {
      batch[1].state_to = -1;
      batch[1].state_from = 0;
      std::fill_n(cache.state(batch[1].state), cache.options().state_floats, std::nanf(""));
      ASSERT_TRUE((*gpu)->copyState(KvCopy::kFromHost, batch[1].state, cache).ok());
    }
    if (linear && step == 7) batch[1].state_from = -1;
    // And drafts taken back: at step 8 the second sequence's chunk is its token and a draft,
    // the state after the token also going to slot 0 (row_states, poisoned first); step 9
    // goes on from there (its own slot poisoned) with another token in the draft's place.
    static const std::vector<int32_t> kRowStates = {0};
    if (linear && step == 8) {
      std::fill_n(cache.state(0), cache.options().state_floats, std::nanf(""));
      ASSERT_TRUE((*gpu)->copyState(KvCopy::kFromHost, 0, cache).ok());
      tokens[1].push_back(token(rng));
      batch[1].tokens = tokens[1];
      batch[1].row_states = kRowStates;
    }
    if (linear && step == 9) {
      batch[1].row_states = {};
      batch[1].start -= 1;
      tokens[1] = {token(rng)};
      batch[1].tokens = tokens[1];
      batch[1].state_from = 0;
      std::fill_n(cache.state(batch[1].state), cache.options().state_floats, std::nanf(""));
      ASSERT_TRUE((*gpu)->copyState(KvCopy::kFromHost, batch[1].state, cache).ok());
    }
    if (linear && step == 10) batch[1].state_from = -1;
    auto want = cpu_model.forward(batch, cache);
    ASSERT_TRUE(want.ok()) << want.status();
    std::vector<float> expected(want->begin(), want->end());
    auto got = (*gpu)->forward(batch);
    ASSERT_TRUE(got.ok()) << got.status();
    compareLogits(*got, expected, vocab, c);
    // Next: every sequence decodes the CPU's greedy token (the same input on both sides).
    for (size_t s = 0; s < batch.size(); ++s) {
      const float* row = expected.data() + s * vocab;
      const uint32_t next = static_cast<uint32_t>(std::max_element(row, row + vocab) - row);
      batch[s].start += static_cast<int64_t>(batch[s].tokens.size());
      tokens[s] = {next};
      batch[s].tokens = tokens[s];
    }
  }
  std::printf("%s: worst relative L2 %.4f, greedy %d/%d where not a near-tie\n", path.c_str(),
              c.worst_relative, c.greedy_same, c.greedy_checked);
  EXPECT_LE(c.worst_relative, tolerance);
  EXPECT_GT(c.greedy_checked, 0);
  EXPECT_GE(c.greedy_same, min_greedy_fraction * c.greedy_checked);
}

TEST(CudaLlamaModelTest, SmolLm2MatchesTheCpuBackend) {
  CLEAVE_REQUIRE_GPU();
  const std::string path = modelDir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " missing (scripts/install-deps.sh)";
  checkModel(path);
}

// The dense tiny models of tests/golden/gen_engine_hf.py: Llama (f32, bf16, FP8 and NVFP4
// in each convention, llama3 rope scaling), SmolLM2's shape, Qwen2 (QKV bias), Qwen3 (q/k
// norm), Mistral (a sliding window on every layer), Phi-3 (fused QKV and gate/up, a window). NVFP4
// and 128x128-block FP8 matrices stay quantized (the skinny GEMM), others are uploaded as bf16.
class CudaTinyModelTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaTinyModelTest, MatchesTheCpuBackend) {
  CLEAVE_REQUIRE_GPU();
  checkModel(goldenDir() + "/engine/hf/" + GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Dense, CudaTinyModelTest,
    ::testing::Values("llama_f32", "llama3_rope_f32", "llama_bf16", "llama_fp8", "smollm2_like_f32",
                      "qwen2_f32", "qwen3_f32", "mistral_f32", "ministral3_f32", "llama_bias_f32",
                      "seed_oss_f32", "smollm3_f32", "phi3_f32", "phi3_longrope_f32",
                      "phi3_longrope_short_f32", "llama_fp8_block128", "llama_fp8_ct_channel",
                      "llama_nvfp4_modelopt", "llama_nvfp4_ct"));

// Gemma 3: norms after attention and the MLP, the GELU (tanh) MLP, embeddings times √hidden,
// query_pre_attn_scalar's softmax scale, sliding layers with their own rotary base, the
// logits' soft cap (gemma3_f32); as the 1B-12B models and their GGUF files (pattern6).
INSTANTIATE_TEST_SUITE_P(Gemma3, CudaTinyModelTest,
                         ::testing::Values("gemma3_f32", "gemma3_pattern6_f32",
                                           "../gguf/gemma3_pattern6_f32.gguf"));

// Gemma 2: Gemma 3's graph without Q/K norms, every other layer sliding, the attention scores
// soft-capped in the attention kernels.
INSTANTIATE_TEST_SUITE_P(Gemma2, CudaTinyModelTest,
                         ::testing::Values("gemma2_f32", "../gguf/gemma2_f32.gguf"));

// OLMo 2 and 3: no norms before attention and the MLP (the residual stream copied in), norms
// after them, Q and K normed across heads; OLMo 3's sliding layers with their own rotation.
INSTANTIATE_TEST_SUITE_P(Olmo, CudaTinyModelTest,
                         ::testing::Values("olmo2_f32", "olmo3_f32", "exaone4_f32"));

// GLM-4 (dense): sandwich norms (no 1 + w), Q/K/V biases, gate and up fused, rotary embedding on
// adjacent pairs of the first half of each head.
INSTANTIATE_TEST_SUITE_P(Glm4, CudaTinyModelTest,
                         ::testing::Values("glm4_f32", "../gguf/glm4_f32.gguf"));

// Granite 3: embeddings, residual adds (in the fused norm) and logits scaled, its own softmax
// scale, biases on Q, K, V and O.
INSTANTIATE_TEST_SUITE_P(Granite, CudaTinyModelTest, ::testing::Values("granite_f32"));

// Qwen3.5: Gated DeltaNet layers (their states in slots beside the KV cache) between gated
// attention layers (a sigmoid gate per query value, a quarter of each head rotating); from
// Hugging Face and from llama.cpp's GGUF, whose value heads are tiled over the key heads.
INSTANTIATE_TEST_SUITE_P(Qwen35, CudaTinyModelTest,
                         ::testing::Values("qwen3_5_f32", "../gguf/qwen3_5_f32.gguf"));

// llama.cpp's NVFP4 blocks (qwen3_nvfp4.gguf: its attention, gate and up projections) on the
// GPU's NVFP4 path, rearranged at upload, against the CPU's float computation of the same
// values.
TEST(CudaLlamaModelTest, GgufNvfp4MatchesTheCpuBackend) {
  CLEAVE_REQUIRE_GPU();
  checkModel(goldenDir() + "/engine/gguf/qwen3_nvfp4.gguf");
}

// An e4m3 KV cache (3 mantissa bits) against the CPU's f32 one: a looser bound, the same
// greedy tokens away from near-ties.
TEST(CudaLlamaModelTest, Fp8KvCacheStaysCloseToTheCpuBackend) {
  CLEAVE_REQUIRE_GPU();
  checkModel(goldenDir() + "/engine/hf/smollm2_like_f32", cuda::KvDtype::kFp8E4M3, 1e-1);
  checkModel(goldenDir() + "/engine/hf/qwen3_f32", cuda::KvDtype::kFp8E4M3, 1e-1);
}

// Native operands (W8A8 on sm_120, W4A4 on sm_120a) on the quantized checkpoints, each
// matrix whose shape fits them (NVFP4 needs K % 64: the tiny models' down projections stay
// widened). Quantizing the activations moves these tiny random models' logits far more
// than bf16 does: tests/golden/measure_native_operands.py measures, against the widened
// path, worst relative L2 0.10 (FP8), 0.36 (Llama NVFP4) and 0.44 (Qwen3-MoE NVFP4, its
// experts' activations not even counted). The bounds add bf16's 5e-2 and a margin; they
// catch a broken kernel (unrelated logits sit near 1.4), the kernel tests catch the rest.
TEST(CudaLlamaModelTest, NativeOperandsStayCloseToTheCpuBackend) {
  CLEAVE_REQUIRE_GPU();
  struct Case {
    const char* model;
    cuda::ExpertWeightFormat format;
    double bound, greedy;
  };
  int ran = 0;
  for (const Case& c :
       {Case{"llama_fp8_block128", cuda::ExpertWeightFormat::kFp8Block128, 0.2, 0.8},
        Case{"llama_nvfp4_modelopt", cuda::ExpertWeightFormat::kNvfp4, 0.6, 0.0},
        Case{"llama_nvfp4_ct", cuda::ExpertWeightFormat::kNvfp4, 0.6, 0.0},
        Case{"qwen3_moe_nvfp4_ct", cuda::ExpertWeightFormat::kNvfp4, 0.8, 0.0}}) {
    if (!cuda::nativeOperandsPreferred(c.format)) continue;
    checkModel(goldenDir() + "/engine/hf/" + c.model, cuda::KvDtype::kBf16, c.bound, c.greedy,
               cuda::GemmOperands::kAuto);
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "this GPU has no native FP8 or E2M1 MMA (sm_120 / sm_120a)";
}

// What a worker plans with is what create() then allocates: the same weights, and for any
// pool the workspace plus one block's bytes per block (to the arena's alignment), on a
// dense, a latent-attention and an NVFP4 model; the device's memory comes with it.
TEST(CudaLlamaModelTest, TheEstimateIsWhatCreateAllocates) {
  CLEAVE_REQUIRE_GPU();
  // Qwen3.5: the state slots are the memory plan's to count (MemoryPlan::state_bytes), not
  // the estimate's.
  for (const char* name : {"llama_f32", "deepseek_v3_moe_f32", "llama_nvfp4_ct", "qwen3_5_f32"}) {
    SCOPED_TRACE(name);
    auto weights = loadLlama(goldenDir() + "/engine/hf/" + name);
    ASSERT_TRUE(weights.ok()) << weights.status();
    const int64_t slot_bytes = linearStateFloats((*weights)->config, (*weights)->dims) * 4;
    for (cuda::KvDtype dtype : {cuda::KvDtype::kBf16, cuda::KvDtype::kFp8E4M3}) {
      CudaModelOptions options{.max_step_tokens = 96,
                               .max_sequences = 5,
                               .max_context = 256,
                               .kv_blocks = 37,
                               .state_slots = 3,
                               .kv_dtype = dtype};
      auto estimate = CudaLlamaModel::estimate(**weights, options);
      ASSERT_TRUE(estimate.ok()) << estimate.status();
      EXPECT_GT(estimate->free_bytes, 0);
      EXPECT_GE(estimate->total_bytes, estimate->free_bytes);
      auto model = CudaLlamaModel::create(**weights, options);
      ASSERT_TRUE(model.ok()) << model.status();
      const CudaMemoryPlan& plan = (*model)->memoryPlan();
      EXPECT_EQ(plan.weights, estimate->weights);
      EXPECT_EQ((*model)->weightBytes(), estimate->weights);
      const int64_t counted = estimate->workspace + 37 * estimate->kv_block_bytes + 3 * slot_bytes;
      EXPECT_NEAR(static_cast<double>(plan.workspace + plan.kv_cache), static_cast<double>(counted),
                  512.0);
    }
  }
}

TEST(CudaLlamaModelTest, RefusesForcedNativeOperands) {
  CLEAVE_REQUIRE_GPU();
  auto weights = loadLlama(goldenDir() + "/engine/hf/llama_nvfp4_ct");
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto gpu = CudaLlamaModel::create(**weights, {.operands = cuda::GemmOperands::kNative});
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
}

// A worker's KV hand-off on GPUs: a prompt prefilled on one model, its blocks copied to
// rows of a host staging area smaller than the cache, moved (as a transport would) into
// other rows of another model's staging area and copied up there into other block ids,
// decodes to the same logits on both; host rows of another shape, ids outside either side
// and spans of different lengths are refused.
TEST(CudaLlamaModelTest, KvRowsMovedThroughTheHostDecodeAsTheirOwnDo) {
  CLEAVE_REQUIRE_GPU();
  // Keys and values, and DeepSeek's one latent part.
  for (const char* name : {"llama_f32", "deepseek_v3_moe_f32"}) {
    auto weights = loadLlama(goldenDir() + "/engine/hf/" + name);
    ASSERT_TRUE(weights.ok()) << weights.status();
    const LlamaWeights& w = **weights;
    const model::KvCacheShape shape = model::kvCacheShape(w.config);
    for (cuda::KvDtype dtype : {cuda::KvDtype::kBf16, cuda::KvDtype::kFp8E4M3}) {
      const bool fp8 = dtype == cuda::KvDtype::kFp8E4M3;
      SCOPED_TRACE(::testing::Message() << name << (fp8 ? " fp8" : " bf16"));
      const CudaModelOptions options{.max_step_tokens = 64,
                                     .max_sequences = 2,
                                     .max_context = 128,
                                     .kv_blocks = 8,
                                     .kv_dtype = dtype};
      const KvStorageOptions host_shape{.num_layers = static_cast<int64_t>(w.layers.size()),
                                        .kv_heads = w.dims.kv_heads.size,
                                        .head_dim = shape.head_dim,
                                        .block_size = 16,
                                        .num_blocks = 3,  // a staging area, not the pool
                                        .type = fp8 ? cpu::KvType::kFp8E4M3 : cpu::KvType::kBf16,
                                        .parts = shape.parts};
      KvStorage sent(host_shape), received(host_shape);
      // The models after the host rows they lock, so they go first.
      auto sender = CudaLlamaModel::create(w, options);
      auto receiver = CudaLlamaModel::create(w, options);
      ASSERT_TRUE(sender.ok()) << sender.status();
      ASSERT_TRUE(receiver.ok()) << receiver.status();
      std::mt19937 rng(cuda::testing::freshSeed());
      std::uniform_int_distribution<uint32_t> token(0,
                                                    static_cast<uint32_t>(w.config.vocab_size - 1));
      std::vector<uint32_t> prompt(37);
      for (uint32_t& t : prompt) t = token(rng);
      // GPU blocks 2, 3 go to host rows 1, 2 in one run; the receiver's rows are in another
      // order again.
      const std::vector<int32_t> blocks = {5, 2, 3}, placed = {0, 1, 6};
      const std::vector<int32_t> sent_rows = {0, 1, 2}, received_rows = {2, 0, 1};
      const SequenceChunk prefill{.tokens = prompt, .start = 0, .blocks = blocks};
      ASSERT_TRUE((*sender)->forward({&prefill, 1}).ok());
      std::memset(sent.data(), 0x7f, static_cast<size_t>(sent.bytes()));  // poisoned
      ASSERT_TRUE((*sender)->copyKv(KvCopy::kToHost, blocks, sent_rows, sent).ok());
      const size_t block_bytes = static_cast<size_t>(sent.kvHeads() * sent.headBlockBytes());
      for (size_t i = 0; i < blocks.size(); ++i)
        for (int64_t l = 0; l < host_shape.num_layers; ++l)
          for (int kv = 0; kv < sent.parts(); ++kv)
            std::memcpy(received.data() + received.offset(l, kv, received_rows[i], 0),
                        sent.data() + sent.offset(l, kv, sent_rows[i], 0), block_bytes);
      ASSERT_TRUE((*receiver)->copyKv(KvCopy::kFromHost, placed, received_rows, received).ok());
      const std::vector<uint32_t> next = {prompt[3]};
      const SequenceChunk here{.tokens = next, .start = 37, .blocks = blocks};
      const SequenceChunk there{.tokens = next, .start = 37, .blocks = placed};
      auto want = (*sender)->forward({&here, 1});
      ASSERT_TRUE(want.ok()) << want.status();
      const std::vector<float> expected(want->begin(), want->end());
      auto got = (*receiver)->forward({&there, 1});
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(std::vector<float>(got->begin(), got->end()), expected);
      // The CPU engine reads the same rows as its own: the two backends lay the cache out
      // alike (rotation pairing, norm, element type), so it continues the sequence too.
      cpu::ThreadPool pool(2);
      LlamaModel cpu_model(w, pool);
      const SequenceChunk on_host{.tokens = next, .start = 37, .blocks = sent_rows};
      auto cpu_next = cpu_model.forward({&on_host, 1}, sent);
      ASSERT_TRUE(cpu_next.ok()) << cpu_next.status();
      Comparison c;
      compareLogits(expected, std::vector<float>(cpu_next->begin(), cpu_next->end()),
                    w.config.vocab_size, c);
      EXPECT_LE(c.worst_relative, fp8 ? 1.5e-1 : 5e-2);
      KvStorageOptions other = host_shape;
      other.block_size = 32;
      KvStorage wrong(other);
      EXPECT_EQ((*sender)->copyKv(KvCopy::kToHost, blocks, sent_rows, wrong).code(),
                absl::StatusCode::kInvalidArgument);
      const std::vector<int32_t> outside = {8}, row = {0}, past_rows = {3}, block = {1};
      EXPECT_EQ((*sender)->copyKv(KvCopy::kToHost, outside, row, sent).code(),
                absl::StatusCode::kInvalidArgument);
      EXPECT_EQ((*sender)->copyKv(KvCopy::kToHost, block, past_rows, sent).code(),
                absl::StatusCode::kInvalidArgument);
      EXPECT_EQ((*sender)->copyKv(KvCopy::kToHost, blocks, row, sent).code(),
                absl::StatusCode::kInvalidArgument);
    }
  }
}

// Mixture-of-experts models: Qwen3-MoE and Mixtral with bf16 experts, Qwen3-MoE with NVFP4
// experts run natively (W4A16). A token whose top experts are a near-tie can be routed
// differently in bf16 than in f32, which moves its logits far more than rounding does; the
// bounds leave room for a few such tokens.
class CudaMoeModelTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaMoeModelTest, MatchesTheCpuBackend) {
  CLEAVE_REQUIRE_GPU();
  checkModel(goldenDir() + "/engine/hf/" + GetParam(), cuda::KvDtype::kBf16, 1.5e-1, 0.9);
}

INSTANTIATE_TEST_SUITE_P(Moe, CudaMoeModelTest,
                         ::testing::Values("qwen3_moe_f32", "mixtral_f32", "qwen3_moe_nvfp4_ct",
                                           "qwen3_moe_int4_ct"));

// gpt-oss: attention sinks, a sliding window on every other layer, biases on Q/K/V/O, the
// router and the experts, the clamped SwiGLU, YaRN's attention factor; experts stored as
// floats or as OpenAI's MXFP4 (NVFP4 on the GPU), from Hugging Face folders and GGUF.
INSTANTIATE_TEST_SUITE_P(GptOss, CudaMoeModelTest,
                         ::testing::Values("gpt_oss_f32", "gpt_oss_mxfp4",
                                           "../gguf/gpt_oss_mxfp4.gguf"));

// GLM-4.5: DeepSeek-V3's routing and shared expert on grouped-query attention with Q/K/V
// biases and Q/K norms, the first half of each head rotating; from Hugging Face and from GGUF
// (whose multi-token-prediction layer is left out).
INSTANTIATE_TEST_SUITE_P(Glm, CudaMoeModelTest,
                         ::testing::Values("glm4_moe_f32", "../gguf/glm4_moe_f32.gguf"));

// MiniMax-M2: sigmoid routing with a correction bias and no groups, Q and K normed across
// heads, half of each head rotating.
INSTANTIATE_TEST_SUITE_P(MiniMax, CudaMoeModelTest,
                         ::testing::Values("minimax_m2_f32", "../gguf/minimax_m2_f32.gguf"));

// Qwen3.5-MoE (a shared expert gated by σ(x · shared_expert_gate), from Hugging Face and
// GGUF) and Qwen3-Next (grouped q/k/v/z and b/a projections, dense and MoE layers) on the
// linear-attention layers of Qwen3.5.
INSTANTIATE_TEST_SUITE_P(Qwen35Moe, CudaMoeModelTest,
                         ::testing::Values("qwen3_5_moe_f32", "../gguf/qwen3_5_moe_f32.gguf",
                                           "qwen3_next_f32"));

// DeepSeek-V3's multi-head latent attention (the latent cache, absorbed queries, the
// CUDA-core latent attention kernel) with its MoE: float, bf16 and FP8 128x128 checkpoints
// (low-rank Q, interleaved rope), V2-Lite's full-rank Q, rotate-half rope and YaRN, and
// YaRN with an attention factor other than 1 on cos and sin (deepseek_v2_yarn_f32).
INSTANTIATE_TEST_SUITE_P(LatentAttention, CudaMoeModelTest,
                         ::testing::Values("deepseek_v3_moe_f32", "deepseek_v3_bf16",
                                           "deepseek_v3_fp8_block128", "deepseek_v2_lite_f32",
                                           "deepseek_v2_moe_f32", "deepseek_v2_yarn_f32",
                                           "deepseek_v3_wide_latent_f32",
                                           "../gguf/deepseek_v3_wide_latent_f32.gguf"));

// Random MoE weights (what the benchmarks run) in both expert formats give finite logits,
// through the decode graphs too; with latent attention as well (DeepSeek-V3's shape).
TEST(CudaLlamaModelTest, RandomMoeModelsRun) {
  CLEAVE_REQUIRE_GPU();
  const std::pair<const char*, cuda::ExpertWeightFormat> cases[] = {
      {"qwen3_moe_f32", cuda::ExpertWeightFormat::kBf16},
      {"qwen3_moe_f32", cuda::ExpertWeightFormat::kNvfp4},
      {"gpt_oss_f32", cuda::ExpertWeightFormat::kBf16},
      {"glm4_moe_f32", cuda::ExpertWeightFormat::kNvfp4},
      {"deepseek_v3_moe_f32", cuda::ExpertWeightFormat::kBf16}};
  for (const auto& [name, format] : cases) {
    SCOPED_TRACE(name);
    auto config = model::loadModelConfig(goldenDir() + "/engine/hf/" + name);
    ASSERT_TRUE(config.ok()) << config.status();
    auto m = CudaLlamaModel::createRandom(*config,
                                          {.max_step_tokens = 64,
                                           .max_sequences = 4,
                                           .max_context = 64,
                                           .random_expert_format = format},
                                          7);
    ASSERT_TRUE(m.ok()) << m.status();
    std::vector<uint32_t> prompt = {3, 1, 4, 1, 5, 9};
    std::vector<int32_t> blocks = {0};
    std::vector<SequenceChunk> batch = {{prompt, 0, blocks}};
    for (int step = 0; step < 4; ++step) {
      auto logits = (*m)->forward(batch);
      ASSERT_TRUE(logits.ok()) << logits.status();
      for (float v : *logits) ASSERT_TRUE(std::isfinite(v)) << "step " << step;
      batch[0].start += static_cast<int64_t>(batch[0].tokens.size());
      prompt = {static_cast<uint32_t>(step + 10)};
      batch[0].tokens = prompt;
    }
  }
}

// Tensor parallelism across two GPUs (NCCL, and the P2P all-reduce where the GPUs allow)
// against one GPU, both through TpGroup: the same logits within bf16 rounding of the
// all-reduced partial sums, decode steps through the graphs included.
TEST(CudaLlamaModelTest, TwoGpuTensorParallelMatchesOneGpu) {
  CLEAVE_REQUIRE_GPU();
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  if (gpus < 2) GTEST_SKIP() << "one GPU: tensor parallelism needs two";
  // gpt-oss: the O and expert down-projection biases join one rank's partial sums only.
  // Qwen3.5 and Qwen3-Next: each rank runs its key heads' share of the linear layers.
  for (const char* name :
       {"llama_f32", "qwen2_f32", "qwen3_moe_f32", "gpt_oss_f32", "glm4_moe_f32", "gemma3_f32",
        "minimax_m2_f32", "olmo3_f32", "qwen3_5_f32", "qwen3_next_f32"}) {
    SCOPED_TRACE(name);
    const std::string path = goldenDir() + "/engine/hf/" + name;
    std::vector<std::vector<float>> steps[2];
    for (int tp : {1, 2}) {
      auto group = TpGroup::load(path, {.tp = tp, .backend = cudaStepBackend({})});
      ASSERT_TRUE(group.ok()) << group.status();
      ASSERT_TRUE((*group)->allocateKv(16, 16, 0, /*state_slots=*/4).ok());
      // Three sequences: decode steps run the graph bucket of four, one padding row.
      std::vector<std::vector<uint32_t>> tokens = {
          {3, 14, 15, 92, 65, 35, 89, 79}, {2, 71, 82}, {16, 18, 3, 39, 88}};
      std::vector<std::vector<int32_t>> blocks = {{0, 1}, {2, 3}, {4, 5}};
      std::vector<SequenceChunk> batch;
      const bool linear = (*group)->config().linear_attention.has_value();
      for (int q = 0; q < 3; ++q)
        batch.push_back({.tokens = tokens[q], .blocks = blocks[q], .state = linear ? q : -1});
      for (int step = 0; step < 5; ++step) {
        // Drawn greedily on the GPU from the ranks' gathered logits, and returned too.
        const std::vector<RowOutput> rows(3, RowOutput{.logits = true, .draw = DeviceDraw{}});
        auto out = (*group)->forwardAndDraw(batch, rows);
        ASSERT_TRUE(out.ok()) << out.status();
        steps[tp - 1].emplace_back(out->logits.begin(), out->logits.end());
        const int64_t vocab = static_cast<int64_t>(out->logits.size()) / 3;
        ASSERT_EQ(out->tokens.size(), 3u);
        for (int q = 0; q < 3; ++q) {
          const float* row = out->logits.data() + q * vocab;
          const uint32_t argmax = static_cast<uint32_t>(std::max_element(row, row + vocab) - row);
          EXPECT_EQ(out->tokens[q], static_cast<int32_t>(argmax)) << "tp " << tp << " row " << q;
          batch[q].start += static_cast<int64_t>(batch[q].tokens.size());
          tokens[q] = {argmax};
          batch[q].tokens = tokens[q];
        }
      }
    }
    const int64_t vocab = static_cast<int64_t>(steps[0][0].size()) / 3;
    Comparison c;
    for (size_t step = 0; step < steps[0].size(); ++step)
      compareLogits(steps[1][step], steps[0][step], vocab, c);
    std::printf("%s tp=2 vs tp=1 on the GPU: worst relative L2 %.4f\n", name, c.worst_relative);
    EXPECT_LE(c.worst_relative, 3e-2);
  }
}

// Which matrices of the quantized goldens the GPU keeps quantized (no GPU needed): NVFP4
// where K is a multiple of 32 (not the MLP down projection of 176 columns), FP8 only with
// DeepSeek's 128 x 128 blocks, everything else bf16; stacks only when every part agrees.
// What the kernels do not run is refused by name before a device is touched: heads of 96,
// experts gated by GELU, linear-attention key heads of 256.
TEST(CudaWeightsTest, ShapesTheKernelsDoNotRunAreRefused) {
  auto config = model::loadModelConfig(goldenDir() + "/engine/hf/gemma3_f32");
  ASSERT_TRUE(config.ok()) << config.status();
  model::ModelConfig wide = *config;
  wide.head_dim = 96;
  auto refused = CudaLlamaModel::createRandom(wide, {}, 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented) << refused.status();
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("head_dim 96"));
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("--backend cpu"));
  auto moe = model::loadModelConfig(goldenDir() + "/engine/hf/qwen3_moe_f32");
  ASSERT_TRUE(moe.ok()) << moe.status();
  moe->mlp_activation = model::MlpActivation::kGeluTanh;
  refused = CudaLlamaModel::createRandom(*moe, {}, 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented) << refused.status();
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("GELU"));
  // Linear-attention key heads past the delta-rule kernel's 128 rows.
  auto hybrid = model::loadModelConfig(goldenDir() + "/engine/hf/qwen3_5_f32");
  ASSERT_TRUE(hybrid.ok()) << hybrid.status();
  hybrid->linear_attention->key_head_dim = 256;
  refused = CudaLlamaModel::createRandom(*hybrid, {}, 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented) << refused.status();
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("key heads of 256"));
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("--backend cpu"));
}

TEST(CudaWeightsTest, QuantizedMatricesKeepTheFormatsTheKernelsRead) {
  using F = cuda::ExpertWeightFormat;
  auto load = [](const char* name) {
    auto w = loadLlama(goldenDir() + "/engine/hf/" + name);
    EXPECT_TRUE(w.ok()) << w.status();
    return std::move(*w);
  };
  auto nvfp4 = load("llama_nvfp4_ct");
  const LlamaLayer& l = nvfp4->layers[0];
  EXPECT_EQ(nativeFormat(l.wq), F::kNvfp4);
  EXPECT_EQ(stackFormat({&l.wq, &l.wk, &l.wv}), F::kNvfp4);
  EXPECT_EQ(stackFormat({&l.w_gate, &l.w_up}), F::kNvfp4);
  EXPECT_EQ(nativeFormat(l.w_down), F::kBf16);
  EXPECT_EQ(nativeFormat(nvfp4->output), F::kBf16);
  auto fp8 = load("llama_fp8_block128");
  const LlamaLayer& b = fp8->layers[0];
  EXPECT_EQ(stackFormat({&b.wq, &b.wk, &b.wv}), F::kFp8Block128);
  EXPECT_EQ(stackFormat({&b.w_gate, &b.w_up}), F::kFp8Block128);
  EXPECT_EQ(nativeFormat(b.w_down), F::kFp8Block128);
  EXPECT_EQ(stackFormat({&b.wq, &l.wk}), F::kBf16);  // Formats differ.
  auto small_blocks = load("llama_fp8");
  EXPECT_EQ(nativeFormat(small_blocks->layers[0].wq), F::kBf16);
  auto moe = load("qwen3_moe_nvfp4_ct");
  EXPECT_EQ(nativeFormat(moe->layers[0].moe->experts[0].down), F::kNvfp4);
  // llama.cpp's NVFP4 blocks too: their codes and scales rearranged at upload.
  auto gguf = loadLlama(goldenDir() + "/engine/gguf/qwen3_nvfp4.gguf", {.cpu_kernels = false});
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  const LlamaLayer& g = (*gguf)->layers[0];
  EXPECT_EQ(stackFormat({&g.wq, &g.wk, &g.wv}), F::kNvfp4);
  EXPECT_EQ(nativeFormat(g.w_down), F::kBf16);  // 176 columns: float32 in the file.
  EXPECT_EQ(nativeFormat(moe->layers[0].moe->router), F::kBf16);
  // gpt-oss's MXFP4 experts, loaded for another backend from its Hugging Face folder and its
  // GGUF file: NVFP4 (rewritten at upload, model::mxfp4AsNvfp4).
  for (const std::string& path : {goldenDir() + "/engine/hf/gpt_oss_mxfp4",
                                  goldenDir() + "/engine/gguf/gpt_oss_mxfp4.gguf"}) {
    SCOPED_TRACE(path);
    auto oss = loadLlama(path, {.cpu_kernels = false});
    ASSERT_TRUE(oss.ok()) << oss.status();
    const MoeExpert& x = (*oss)->layers[0].moe->experts[0];
    EXPECT_EQ(stackFormat({&x.gate, &x.up}), F::kNvfp4);
    EXPECT_EQ(nativeFormat(x.down), F::kNvfp4);
  }
  // Group scales stored as wider floats that are not all e4m3 values: bf16.
  cpu::WeightMatrix source = l.wq.source();
  std::vector<float> scales(source.rows * source.scales.cols);
  std::copy_n(source.scales.data, scales.size(), scales.begin());
  scales[scales.size() / 2] = 0.3f;  // between e4m3's 0.28125 and 0.3125
  source.scales.data = scales.data();
  auto odd = cpu::CpuMatrix::create(source);
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_EQ(nativeFormat(*odd), F::kBf16);
}

// Chunks asking for several rows of logits (a prompt scored for log-probabilities, a decode
// token with drafts to verify) beside single-row ones, then a decode step through the graphs:
// every row's logits and the hidden states behind them as the CPU model's, and each chunk's
// last row drawn on the GPU as in any step (greedy: its logits' argmax); past max_logit_rows
// a step is refused, and without it the model says it has one row per sequence.
TEST(CudaLlamaModelTest, SeveralRowsOfLogitsAndTheirHiddenStatesMatchTheCpuBackend) {
  CLEAVE_REQUIRE_GPU();
  auto weights = loadLlama(goldenDir() + "/engine/hf/smollm2_like_f32", {.cpu_kernels = false});
  ASSERT_TRUE(weights.ok()) << weights.status();
  const LlamaWeights& w = **weights;
  const int64_t vocab = w.config.vocab_size, hidden = w.config.hidden_size;
  auto gpu = CudaLlamaModel::create(
      w, {.max_step_tokens = 64, .max_sequences = 2, .max_logit_rows = 24, .max_context = 64});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_TRUE((*gpu)->multiRowLogits());
  cpu::ThreadPool pool(2);
  LlamaModel cpu_model(w, pool);
  KvStorage cache({.num_layers = static_cast<int64_t>(w.layers.size()),
                   .kv_heads = w.dims.kv_heads.size,
                   .head_dim = w.config.head_dim,
                   .block_size = 16,
                   .num_blocks = (*gpu)->kvBlocks()});
  std::mt19937 rng(cuda::testing::freshSeed());
  std::uniform_int_distribution<uint32_t> token(0, static_cast<uint32_t>(vocab - 1));
  std::vector<uint32_t> a(20), b(9);
  for (uint32_t& t : a) t = token(rng);
  for (uint32_t& t : b) t = token(rng);
  const std::vector<int32_t> a_blocks = {3, 1}, b_blocks = {0};
  // Step 1: a's prompt scored row by row (20 rows), b's prompt's last row.
  // Step 2: a decodes one token with three drafts (4 rows), b one token.
  // Step 3: one token each (a decode step, one row per sequence).
  std::vector<uint32_t> a_next(4), b_next(1), a_last(1), b_last(1);
  for (std::vector<uint32_t>* v : {&a_next, &b_next, &a_last, &b_last})
    for (uint32_t& t : *v) t = token(rng);
  const std::vector<std::vector<SequenceChunk>> steps = {
      {{.tokens = a, .start = 0, .blocks = a_blocks, .logits = 20},
       {.tokens = b, .start = 0, .blocks = b_blocks, .logits = 1}},
      {{.tokens = a_next, .start = 20, .blocks = a_blocks, .logits = 4},
       {.tokens = b_next, .start = 9, .blocks = b_blocks, .logits = 1}},
      {{.tokens = a_last, .start = 24, .blocks = a_blocks},
       {.tokens = b_last, .start = 10, .blocks = b_blocks}}};
  for (const std::vector<SequenceChunk>& batch : steps) {
    SCOPED_TRACE(::testing::Message() << logitRows(batch) << " rows");
    auto want = cpu_model.forward(batch, cache);
    ASSERT_TRUE(want.ok()) << want.status();
    const std::vector<float> expected(want->begin(), want->end());
    const std::vector<float> expected_hidden(cpu_model.lastHidden().begin(),
                                             cpu_model.lastHidden().end());
    const std::vector<RowOutput> outputs(batch.size(),
                                         RowOutput{.logits = true, .draw = DeviceDraw{}});
    auto got = (*gpu)->forwardAndDraw(batch, outputs);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->logits.size(), expected.size());
    Comparison c;
    compareLogits(got->logits, expected, vocab, c);
    EXPECT_LE(c.worst_relative, 5e-2);
    // Each chunk's last row drawn greedily: the argmax (lowest index) of its logits row.
    ASSERT_EQ(got->tokens.size(), batch.size());
    int64_t row = -1;
    for (size_t i = 0; i < batch.size(); ++i) {
      row += batch[i].logits;
      const float* logits = got->logits.data() + row * vocab;
      EXPECT_EQ(got->tokens[i], std::max_element(logits, logits + vocab) - logits) << "chunk " << i;
    }
    const std::span<const float> got_hidden = (*gpu)->lastHidden();
    ASSERT_EQ(got_hidden.size(), static_cast<size_t>(logitRows(batch) * hidden));
    const cuda::testing::Difference d = cuda::testing::compare(
        std::vector<float>(got_hidden.begin(), got_hidden.end()), expected_hidden);
    EXPECT_EQ(d.non_finite, 0);
    EXPECT_LE(d.relative_l2, 5e-2);
  }
  // 25 rows: past max_logit_rows.
  std::vector<uint32_t> long_prompt(25, 7);
  const std::vector<int32_t> long_blocks = {4, 5};
  const SequenceChunk too_many{
      .tokens = long_prompt, .start = 0, .blocks = long_blocks, .logits = 25};
  EXPECT_EQ((*gpu)->forward({&too_many, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  auto single =
      CudaLlamaModel::create(w, {.max_step_tokens = 64, .max_sequences = 2, .max_context = 64});
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_FALSE((*single)->multiRowLogits());
}

TEST(CudaLlamaModelTest, GraphReplayEqualsEagerSteps) {
  CLEAVE_REQUIRE_GPU();
  auto weights = loadLlama(goldenDir() + "/engine/hf/smollm2_like_f32");
  ASSERT_TRUE(weights.ok()) << weights.status();
  CudaModelOptions options{.max_step_tokens = 64, .max_sequences = 3, .max_context = 64};
  auto graphed = CudaLlamaModel::create(**weights, options);
  options.cuda_graphs = false;
  auto eager = CudaLlamaModel::create(**weights, options);
  ASSERT_TRUE(graphed.ok() && eager.ok());
  std::vector<uint32_t> prompt = {5, 17, 99, 3};
  std::vector<int32_t> blocks_a = {0, 1}, blocks_b = {2, 3}, blocks_c = {4, 5};
  std::vector<std::vector<uint32_t>> next = {{7}, {8}, {9}};
  for (CudaLlamaModel* m : {graphed->get(), eager->get()}) {
    std::vector<SequenceChunk> prefill = {
        {prompt, 0, blocks_a}, {prompt, 0, blocks_b}, {prompt, 0, blocks_c}};
    ASSERT_TRUE(m->forward(prefill).ok());
  }
  // Steps 1 and 2 run eagerly then capture; from step 3 on the graph replays.
  for (int step = 0; step < 5; ++step) {
    std::vector<SequenceChunk> decode = {{next[0], 4 + step, blocks_a},
                                         {next[1], 4 + step, blocks_b},
                                         {next[2], 4 + step, blocks_c}};
    auto a = (*graphed)->forward(decode);
    ASSERT_TRUE(a.ok()) << a.status();
    std::vector<float> from_graph(a->begin(), a->end());
    auto b = (*eager)->forward(decode);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(from_graph, std::vector<float>(b->begin(), b->end())) << "step " << step;
  }
}

// Tokens drawn on the GPU against the logits of the same step: greedy rows take the lowest
// index of the largest logit, top_k = 1 is greedy at any temperature, a top_k = 4 draw is
// one of the four largest, the same (seed, index) draws the same token again, and a
// penalized greedy row draws the CPU sampler's token. Logits come back only when a row asks
// for them, unpenalized.
TEST(CudaLlamaModelTest, DrawsOnTheGpuWhatTheLogitsSay) {
  CLEAVE_REQUIRE_GPU();
  auto weights = loadLlama(goldenDir() + "/engine/hf/smollm2_like_f32");
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto m = CudaLlamaModel::create(**weights,
                                  {.max_step_tokens = 64, .max_sequences = 3, .max_context = 64});
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<uint32_t> prompt = {5, 17, 99, 3};
  std::vector<std::vector<int32_t>> blocks = {{0, 1}, {2, 3}, {4, 5}};
  std::vector<SequenceChunk> prefill;
  for (const auto& b : blocks) prefill.push_back({prompt, 0, b});
  ASSERT_TRUE((*m)->forward(prefill).ok());
  std::vector<std::vector<uint32_t>> next = {{7}, {8}, {9}};
  for (int step = 0; step < 4; ++step) {  // step 0: eager, then captured; later: replayed
    SCOPED_TRACE(step);
    std::vector<SequenceChunk> decode;
    for (int q = 0; q < 3; ++q) decode.push_back({next[q], 4 + step, blocks[q]});
    const uint64_t index = static_cast<uint64_t>(step);
    const std::vector<RowOutput> rows = {
        {.logits = true, .draw = DeviceDraw{.index = index}},
        {.logits = true,
         .draw = DeviceDraw{.temperature = 2.0f, .top_k = 1, .seed = 4, .index = index}},
        {.logits = true,
         .draw = DeviceDraw{.temperature = 1.5f, .top_k = 4, .seed = 9, .index = index}}};
    auto out = (*m)->forwardAndDraw(decode, rows);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->tokens.size(), 3u);
    const int64_t vocab = static_cast<int64_t>(out->logits.size()) / 3;
    ASSERT_EQ(vocab, (*weights)->config.vocab_size);
    std::vector<float> logits(out->logits.begin(), out->logits.end());
    const std::vector<int32_t> tokens(out->tokens.begin(), out->tokens.end());
    for (int q = 0; q < 2; ++q) {
      const float* row = logits.data() + q * vocab;
      EXPECT_EQ(tokens[q], std::max_element(row, row + vocab) - row) << "row " << q;
    }
    std::vector<float> third(logits.begin() + 2 * vocab, logits.end());
    std::vector<float> sorted = third;
    std::nth_element(sorted.begin(), sorted.begin() + 3, sorted.end(), std::greater<float>());
    ASSERT_GE(tokens[2], 0);
    ASSERT_LT(tokens[2], vocab);
    EXPECT_GE(third[tokens[2]], sorted[3]);
    // The same step again (it rewrites the same KV rows) without logits: the same draws.
    std::vector<RowOutput> drawn_only = rows;
    for (RowOutput& r : drawn_only) r.logits = false;
    auto again = (*m)->forwardAndDraw(decode, drawn_only);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(again->logits.empty());
    EXPECT_EQ(std::vector<int32_t>(again->tokens.begin(), again->tokens.end()), tokens);
    // Rows of each kind in one step: drawn only, logits only, both. Logits come back for
    // every row, as the first call's; the drawn rows draw what they drew then.
    std::vector<RowOutput> mixed = {drawn_only[0], {.logits = true}, rows[2]};
    auto kinds = (*m)->forwardAndDraw(decode, mixed);
    ASSERT_TRUE(kinds.ok()) << kinds.status();
    EXPECT_EQ(std::vector<float>(kinds->logits.begin(), kinds->logits.end()), logits);
    ASSERT_EQ(kinds->tokens.size(), 3u);
    EXPECT_EQ(kinds->tokens[0], tokens[0]);
    EXPECT_EQ(kinds->tokens[2], tokens[2]);
    for (int q = 0; q < 3; ++q) next[q] = {static_cast<uint32_t>(tokens[q])};
  }
  // A penalized greedy row drawn on the GPU takes the CPU sampler's token for the same
  // logits (the logits copied back are the model's, before the penalties).
  std::vector<SequenceChunk> step = {
      {next[0], 8, blocks[0]}, {next[1], 8, blocks[1]}, {next[2], 8, blocks[2]}};
  auto plain = (*m)->forward(step);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::vector<float> raw(plain->begin(), plain->end());
  const int64_t vocab = (*weights)->config.vocab_size;
  Sampler penalized(
      {.repetition_penalty = 1.5f, .presence_penalty = 2.0f, .frequency_penalty = 1.0f}, prompt);
  // Its output so far: the top three tokens of this step, so the penalties decide.
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 3, order.end(),
                    [&](int32_t a, int32_t b) { return raw[a] > raw[b]; });
  for (int32_t t : {order[0], order[0], order[1], order[2]})
    penalized.observe(static_cast<uint32_t>(t));
  std::vector<RowOutput> with_penalties = {
      {.logits = true, .draw = penalized.deviceDraw()}, {.logits = true}, {.logits = true}};
  auto out = (*m)->forwardAndDraw(step, with_penalties);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(std::vector<float>(out->logits.begin(), out->logits.end()), raw);
  const SampledToken want = penalized.sample(std::span<const float>(raw).first(vocab));
  EXPECT_NE(want.token, static_cast<uint32_t>(order[0]));  // The penalties moved it.
  EXPECT_EQ(out->tokens[0], static_cast<int32_t>(want.token));

  // Log-probabilities of a drawn row (the model's distribution, and the best three) as the
  // CPU sampler reports them, within float sums' rounding.
  Sampler reporting({.logprobs = 3}, prompt);
  std::vector<RowOutput> with_logprobs = {{.draw = reporting.deviceDraw()}, {}, {}};
  auto reported = (*m)->forwardAndDraw(step, with_logprobs);
  ASSERT_TRUE(reported.ok()) << reported.status();
  ASSERT_EQ(reported->logprobs.size(), 3u);
  const SampledToken cpu = reporting.sample(std::span<const float>(raw).first(vocab));
  EXPECT_EQ(reported->tokens[0], static_cast<int32_t>(cpu.token));
  EXPECT_NEAR(reported->logprobs[0], cpu.logprob, 1e-4);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(reported->top[k].token, static_cast<int32_t>(cpu.top[k].first)) << k;
    EXPECT_NEAR(reported->top[k].logprob, cpu.top[k].second, 1e-4) << k;
  }

  std::vector<RowOutput> too_few(2);
  std::vector<SequenceChunk> one = {
      {next[0], 8, blocks[0]}, {next[1], 8, blocks[1]}, {next[2], 8, blocks[2]}};
  EXPECT_EQ((*m)->forwardAndDraw(one, too_few).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaLlamaModelTest, RefusesBatchesOutsideItsBounds) {
  CLEAVE_REQUIRE_GPU();
  auto weights = loadLlama(goldenDir() + "/engine/hf/smollm2_like_f32");
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto m = CudaLlamaModel::create(**weights,
                                  {.max_step_tokens = 16, .max_sequences = 2, .max_context = 32});
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<uint32_t> long_prompt(20, 1), bad_token = {1u << 30};
  std::vector<int32_t> blocks = {0, 1};
  std::vector<SequenceChunk> too_many_tokens = {{long_prompt, 0, blocks}};
  EXPECT_EQ((*m)->forward(too_many_tokens).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<SequenceChunk> outside_vocab = {{bad_token, 0, blocks}};
  EXPECT_EQ((*m)->forward(outside_vocab).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> foreign = {static_cast<int32_t>((*m)->kvBlocks())};
  std::vector<uint32_t> one = {1};
  std::vector<SequenceChunk> scratch_block = {{one, 0, foreign}};
  EXPECT_EQ((*m)->forward(scratch_block).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave::engine
