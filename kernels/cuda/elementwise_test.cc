// The GPU's per-token ops against the CPU backend on the same bf16 inputs: RMSNorm (with
// and without the residual add, and as per-head q/k norm), SiLU-and-mul, RoPE with the
// KV-cache write in both pairings, embedding lookup, argmax, and joining column slices.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cstring>

#include "common/model/model_config.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/rope_kv.h"

namespace cleave::cuda {
namespace {

using testing::bf16;
using testing::DeviceBuffer;

std::vector<float> roundedToBf16(std::vector<float> v) {
  for (float& x : v) x = __bfloat162float(__float2bfloat16(x));
  return v;
}

TEST(RmsNormTest, MatchesCpuBackend) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  for (int64_t cols : {64, 576, 4096, 5120 + 2}) {
    for (bool with_residual : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "cols " << cols << " residual " << with_residual);
      const int64_t rows = 37;
      std::vector<bf16> x = testing::randomBf16(rows * cols, rng, 3.0f);
      std::vector<bf16> residual = testing::randomBf16(rows * cols, rng, 3.0f);
      // f32 weights with bits below bf16's: Gemma's 1 + w must not be rounded.
      std::vector<float> weight = testing::toFloat(testing::randomBf16(cols, rng, 2.0f));
      for (float& v : weight) v = 1.0f + v * 0.37f;
      std::vector<float> input = testing::toFloat(x);
      if (with_residual) {
        std::vector<float> r = testing::toFloat(residual);
        for (size_t i = 0; i < input.size(); ++i) input[i] += r[i];
        input = roundedToBf16(input);
      }
      std::vector<float> want(rows * cols);
      cpu::rmsNorm(input.data(), cols, weight.data(), rows, cols, 1e-5f, want.data(), cols);

      DeviceBuffer<bf16> dx(x), dres(residual), dout(x.size());
      DeviceBuffer<float> dw(weight);
      absl::Status s = rmsNorm({.x = dx.get(),
                                .x_stride = cols,
                                .residual = with_residual ? dres.get() : nullptr,
                                .residual_stride = cols,
                                .weight = dw.get(),
                                .rows = rows,
                                .cols = cols,
                                .eps = 1e-5f,
                                .out = dout.get(),
                                .out_stride = cols},
                               nullptr);
      ASSERT_TRUE(s.ok()) << s;
      CUDA_ASSERT_OK(cudaDeviceSynchronize());
      const auto d = testing::compare(testing::toFloat(dout.copyToHost()), want);
      EXPECT_EQ(d.non_finite, 0);
      EXPECT_LE(d.relative_l2, 8e-3);
      if (with_residual) {
        const auto r = testing::compare(testing::toFloat(dres.copyToHost()), input);
        EXPECT_EQ(r.max_abs, 0.0) << "the stored residual is the bf16 sum";
      }
    }
  }
}

// A row split over two ranks (OLMo 2's Q normed across heads): each part's sums of squares
// (squares_out), summed as the all-reduce would, then each part normed with the whole row's
// sums, against the CPU's norm of the whole row. Without weights the kernel only adds the
// residual and copies the sum (a layer with no norm before its attention).
TEST(RmsNormTest, RowSplitOverRanksAndNoWeight) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  const int64_t rows = 21, cols = 96, split = 32;
  std::vector<bf16> x = testing::randomBf16(rows * cols, rng, 3.0f);
  std::vector<float> weight = testing::toFloat(testing::randomBf16(cols, rng, 2.0f));
  const std::vector<float> input = testing::toFloat(x);
  std::vector<float> want(rows * cols);
  cpu::rmsNorm(input.data(), cols, weight.data(), rows, cols, 1e-6f, want.data(), cols);
  DeviceBuffer<bf16> dx(x);
  DeviceBuffer<bf16> dout(std::vector<bf16>(x.size(), __float2bfloat16(NAN)));
  DeviceBuffer<float> dw(weight);
  const int64_t begin[2] = {0, split}, width[2] = {split, cols - split};
  std::vector<float> sums(rows, 0.0f);
  for (int part = 0; part < 2; ++part) {
    DeviceBuffer<float> squares(std::vector<float>(rows, NAN));
    ASSERT_TRUE(rmsNorm({.x = dx.get() + begin[part],
                         .x_stride = cols,
                         .rows = rows,
                         .cols = width[part],
                         .squares_out = squares.get()},
                        nullptr)
                    .ok());
    const std::vector<float> partial = squares.copyToHost();
    for (int64_t r = 0; r < rows; ++r) sums[r] += partial[r];
  }
  DeviceBuffer<float> dsums(sums);
  for (int part = 0; part < 2; ++part) {
    ASSERT_TRUE(rmsNorm({.x = dx.get() + begin[part],
                         .x_stride = cols,
                         .weight = dw.get() + begin[part],
                         .rows = rows,
                         .cols = width[part],
                         .eps = 1e-6f,
                         .out = dout.get() + begin[part],
                         .out_stride = cols,
                         .squares = dsums.get(),
                         .norm_cols = cols},
                        nullptr)
                    .ok());
  }
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const auto d = testing::compare(testing::toFloat(dout.copyToHost()), want);
  EXPECT_EQ(d.non_finite, 0);
  EXPECT_LE(d.relative_l2, 8e-3);

  std::vector<bf16> residual = testing::randomBf16(rows * cols, rng, 3.0f);
  DeviceBuffer<bf16> dres(residual);
  DeviceBuffer<bf16> copied(std::vector<bf16>(x.size(), __float2bfloat16(NAN)));
  ASSERT_TRUE(rmsNorm({.x = dx.get(),
                       .x_stride = cols,
                       .residual = dres.get(),
                       .residual_stride = cols,
                       .rows = rows,
                       .cols = cols,
                       .out = copied.get(),
                       .out_stride = cols},
                      nullptr)
                  .ok());
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<float> sum = testing::toFloat(dres.copyToHost());
  const auto c = testing::compare(testing::toFloat(copied.copyToHost()), sum);
  EXPECT_EQ(c.max_abs, 0.0) << "no weight: the residual sum copied";
  EXPECT_EQ(c.non_finite, 0);
}

// SiLU's and GELU's (tanh form, Gemma's) gated products against the CPU backend's.
TEST(GatedMulTest, MatchesCpuBackend) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  const int64_t rows = 19, cols = 1536;
  std::vector<bf16> gate_up = testing::randomBf16(rows * 2 * cols, rng, 4.0f);
  std::vector<float> in = testing::toFloat(gate_up);
  for (const bool gelu : {false, true}) {
    SCOPED_TRACE(gelu ? "gelu_tanh" : "silu");
    std::vector<float> want(rows * cols);
    (gelu ? cpu::geluTanhMul : cpu::siluMul)(in.data(), in.data() + cols, 2 * cols, rows, cols,
                                             want.data(), cols);
    DeviceBuffer<bf16> din(gate_up), dout(rows * cols);  // poisoned
    absl::Status s = (gelu ? geluTanhMul : siluMul)(din.get(), din.get() + cols, 2 * cols, rows,
                                                    cols, dout.get(), cols, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    const auto d = testing::compare(testing::toFloat(dout.copyToHost()), want);
    EXPECT_EQ(d.non_finite, 0);
    EXPECT_LE(d.relative_l2, 8e-3);
  }
}

// Gemma's embedding scale (bf16 in place) and logit soft cap (f32) against the CPU's.
TEST(ScaleAndSoftCapTest, MatchTheCpuBackend) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  const int64_t count = 70001;
  std::vector<bf16> x = testing::randomBf16(count, rng, 2.0f);
  DeviceBuffer<bf16> dx(x);
  ASSERT_TRUE(scale(dx.get(), count, 48.0f, nullptr).ok());
  std::vector<float> want = testing::toFloat(x);
  for (float& v : want) v *= 48.0f;
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const auto scaled = testing::compare(testing::toFloat(dx.copyToHost()), want);
  EXPECT_EQ(scaled.non_finite, 0);
  EXPECT_LE(scaled.relative_l2, 8e-3);

  std::vector<float> logits = testing::toFloat(testing::randomBf16(count, rng, 60.0f));
  DeviceBuffer<float> dlogits(logits);
  ASSERT_TRUE(softCap(dlogits.get(), count, 30.0f, nullptr).ok());
  cpu::softCap(logits.data(), count, 30.0f);
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const auto capped = testing::compare(dlogits.copyToHost(), logits);
  EXPECT_EQ(capped.non_finite, 0);
  EXPECT_LE(capped.relative_l2, 1e-5);
  EXPECT_FALSE(softCap(dlogits.get(), count, 0.0f, nullptr).ok());
}

TEST(RopeKvTest, RotatesQueriesAndKeysAndWritesTheCache) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  // llama3 scaling, YaRN (gpt-oss's: an attention factor of 1.14 on cos and sin; with
  // Ministral 3's query temperature every 4096 positions), and the first half or 48 of 128
  // values of each head rotating (GLM-4.5's partial rotary).
  for (auto [layout, kv, yarn, rotary] :
       {std::tuple{RopeLayout::kHalves, KvDtype::kBf16, false, 0},
        std::tuple{RopeLayout::kAdjacent, KvDtype::kBf16, false, 0},
        std::tuple{RopeLayout::kHalves, KvDtype::kFp8E4M3, false, 0},
        std::tuple{RopeLayout::kHalves, KvDtype::kBf16, true, 0},
        std::tuple{RopeLayout::kHalves, KvDtype::kBf16, false, 64},
        std::tuple{RopeLayout::kAdjacent, KvDtype::kFp8E4M3, false, 48},
        std::tuple{RopeLayout::kHalves, KvDtype::kBf16, false, -1}}) {
    SCOPED_TRACE(::testing::Message() << (layout == RopeLayout::kHalves ? "halves" : "adjacent")
                                      << (kv == KvDtype::kFp8E4M3 ? ", e4m3" : ", bf16")
                                      << (yarn ? ", yarn" : ", llama3") << ", rotary " << rotary);
    const bool fp8 = kv == KvDtype::kFp8E4M3;
    const float k_scale = fp8 ? 0.02f : 1.0f, v_scale = fp8 ? 0.01f : 1.0f;
    const int heads = 6, kv_heads = 2, head_dim = 128, block_size = 16, tokens = 23, blocks = 5;
    model::ModelConfig config;
    config.head_dim = head_dim;
    // rotary -1: a layer that does not rotate (SmolLM3's NoPE): queries and keys copied.
    const bool rotate = rotary >= 0;
    config.rotary_dim = static_cast<uint32_t>(std::max(rotary, 0));
    config.rope_theta = 500000.0;
    if (yarn) {
      config.rope_scaling.type = "yarn";
      config.rope_scaling.factor = 4.0;
      config.rope_scaling.original_max_position_embeddings = 4096;
    } else {
      config.rope_scaling.type = "llama3";
      config.rope_scaling.factor = 8.0;
      config.rope_scaling.low_freq_factor = 1.0;
      config.rope_scaling.high_freq_factor = 4.0;
      config.rope_scaling.original_max_position_embeddings = 8192;
    }
    const cpu::Rope rope(config, layout == RopeLayout::kHalves ? cpu::RopePairing::kHalves
                                                               : cpu::RopePairing::kAdjacent);
    ASSERT_EQ(rope.attentionFactor() != 1.0, yarn);
    const int width = (heads + 2 * kv_heads) * head_dim;
    std::vector<bf16> qkv = testing::randomBf16(static_cast<size_t>(tokens) * width, rng);
    std::vector<int32_t> positions(tokens), slots(tokens);
    std::uniform_int_distribution<int32_t> position(0, 9000);
    std::vector<int32_t> free_slots(blocks * block_size);
    for (size_t i = 0; i < free_slots.size(); ++i) free_slots[i] = static_cast<int32_t>(i);
    std::shuffle(free_slots.begin(), free_slots.end(), rng);
    for (int t = 0; t < tokens; ++t) {
      positions[t] = position(rng);
      slots[t] = free_slots[t];
    }
    // Reference: the CPU backend's rotation of the float copies (the leading values of each
    // head_dim-wide head).
    std::vector<float> ref = testing::toFloat(qkv);
    cpu::RopeAngles angles;
    rope.angles(positions.data(), tokens, angles);
    if (rotate) rope.apply(ref.data(), width, tokens, heads + kv_heads, angles, 0, head_dim);
    if (yarn) {
      config.query_scale_beta = 0.1;
      config.query_scale_period = 4096;
      for (int t = 0; t < tokens; ++t) {
        const float scale = static_cast<float>(config.queryScale(positions[t]));
        for (int i = 0; i < heads * head_dim; ++i) ref[t * width + i] *= scale;
      }
    }

    const size_t cache_elements = static_cast<size_t>(blocks) * kv_heads * block_size * head_dim;
    DeviceBuffer<bf16> dqkv(qkv), dq(static_cast<size_t>(tokens) * heads * head_dim);
    DeviceBuffer<uint8_t> dk(cache_elements * (fp8 ? 1 : 2)), dv(cache_elements * (fp8 ? 1 : 2));
    DeviceBuffer<int32_t> dpos(positions), dslots(slots);
    DeviceBuffer<float> dfreq(rope.inverseFrequencies());
    absl::Status s = ropeKvWrite({.qkv = dqkv.get(),
                                  .qkv_stride = width,
                                  .positions = dpos.get(),
                                  .slots = dslots.get(),
                                  .inv_freq = dfreq.get(),
                                  .attention_factor = static_cast<float>(rope.attentionFactor()),
                                  .query_scale_beta = yarn ? 0.1f : 0.0f,
                                  .query_scale_period = yarn ? 4096 : 0,
                                  .tokens = tokens,
                                  .heads = heads,
                                  .kv_heads = kv_heads,
                                  .head_dim = head_dim,
                                  .rotary_dim = std::max(rotary, 0),
                                  .rotate = rotate,
                                  .block_size = block_size,
                                  .layout = layout,
                                  .q_out = dq.get(),
                                  .q_stride = heads * head_dim,
                                  .k_cache = dk.get(),
                                  .v_cache = dv.get(),
                                  .kv_dtype = kv,
                                  .k_scale = k_scale,
                                  .v_scale = v_scale},
                                 nullptr);
    ASSERT_TRUE(s.ok()) << s;
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    std::vector<float> q = testing::toFloat(dq.copyToHost());
    // The caches as the values they hold.
    auto held = [&](const DeviceBuffer<uint8_t>& cache, float scale) {
      const std::vector<uint8_t> bytes = cache.copyToHost();
      std::vector<float> out(cache_elements);
      for (size_t i = 0; i < cache_elements; ++i) {
        if (fp8) {
          out[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(bytes[i], __NV_E4M3))) * scale;
        } else {
          bf16 b;
          std::memcpy(&b, bytes.data() + 2 * i, 2);
          out[i] = __bfloat162float(b);
        }
      }
      return out;
    };
    const std::vector<float> k = held(dk, k_scale), v = held(dv, v_scale);
    std::vector<float> got_q, want_q, got_k, want_k, got_v, want_v;
    const std::vector<float> raw = testing::toFloat(qkv);
    for (int t = 0; t < tokens; ++t) {
      const int block = slots[t] / block_size, offset = slots[t] % block_size;
      for (int i = 0; i < heads * head_dim; ++i) {
        got_q.push_back(q[t * heads * head_dim + i]);
        want_q.push_back(ref[t * width + i]);
      }
      for (int h = 0; h < kv_heads; ++h)
        for (int i = 0; i < head_dim; ++i) {
          const size_t at =
              ((static_cast<size_t>(block) * kv_heads + h) * block_size + offset) * head_dim + i;
          got_k.push_back(k[at]);
          want_k.push_back(ref[t * width + (heads + h) * head_dim + i]);
          got_v.push_back(v[at]);
          want_v.push_back(raw[t * width + (heads + kv_heads + h) * head_dim + i]);
        }
    }
    for (auto [got, want, name] :
         {std::tuple{&got_q, &want_q, "q"}, std::tuple{&got_k, &want_k, "k"},
          std::tuple{&got_v, &want_v, "v"}}) {
      const auto d = testing::compare(*got, *want);
      EXPECT_EQ(d.non_finite, 0) << name;
      // e4m3 keeps 3 mantissa bits: a relative error up to 2^-4 per element.
      EXPECT_LE(d.relative_l2, std::string(name) != "q" && fp8 ? 4e-2 : 8e-3) << name;
    }
  }
}

TEST(EmbedTest, GathersRowsAndMarksBadIds) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  const int64_t vocab = 1001, cols = 576;
  std::vector<bf16> table = testing::randomBf16(vocab * cols, rng);
  std::vector<int32_t> ids = {0, 1000, 17, 17, 523, -1, 1001};
  DeviceBuffer<bf16> dtable(table), dout(ids.size() * cols);
  DeviceBuffer<int32_t> dids(ids);
  ASSERT_TRUE(embed(dids.get(), static_cast<int64_t>(ids.size()), dtable.get(), vocab, cols,
                    dout.get(), cols, nullptr)
                  .ok());
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<float> out = testing::toFloat(dout.copyToHost());
  const std::vector<float> rows = testing::toFloat(table);
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t c = 0; c < cols; ++c) {
      const float got = out[t * cols + c];
      if (ids[t] < 0 || ids[t] >= vocab)
        ASSERT_TRUE(std::isnan(got)) << "token " << t;
      else
        ASSERT_EQ(got, rows[ids[t] * cols + c]) << "token " << t << " col " << c;
    }
}

TEST(ArgmaxTest, FindsTheFirstLargest) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  const int64_t rows = 9, vocab = 49152 + 7;
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> logits(rows * vocab);
  for (float& v : logits) v = dist(rng);
  // A tie in row 2: the lower index wins.
  logits[2 * vocab + 40000] = 100.0f;
  logits[2 * vocab + 30000] = 100.0f;
  std::vector<int32_t> want(rows);
  for (int64_t r = 0; r < rows; ++r)
    want[r] = static_cast<int32_t>(
        std::max_element(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab) -
        (logits.begin() + r * vocab));
  DeviceBuffer<float> dlogits(logits);
  DeviceBuffer<int32_t> dids(rows);
  ASSERT_TRUE(argmax(dlogits.get(), vocab, rows, vocab, dids.get(), nullptr).ok());
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  EXPECT_EQ(dids.copyToHost(), want);
  EXPECT_EQ(want[2], 30000);
}

// Three slices of 4 rows (7, 1 and 12 columns), the first 3 rows joined side by side, as
// tensor-parallel logits are put back in vocabulary order; the output starts as NaN.
TEST(JoinColumnSlicesTest, PutsEachSlicesColumnsInPlace) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::vector<int64_t> widths = {7, 1, 12};
  const int64_t slice_rows = 4, rows = 3, stride = 20;
  std::vector<float> slices(slice_rows * stride);
  for (float& v : slices) v = dist(rng);
  std::vector<float> want(rows * stride);
  int64_t offset = 0, column = 0;
  for (int64_t w : widths) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < w; ++i) want[r * stride + column + i] = slices[offset + r * w + i];
    offset += slice_rows * w;
    column += w;
  }
  DeviceBuffer<float> dslices(slices);
  DeviceBuffer<float> dout(std::vector<float>(rows * stride, std::nanf("")));
  ASSERT_TRUE(joinColumnSlices(dslices.get(), widths, slice_rows, rows, dout.get(), nullptr).ok());
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  EXPECT_EQ(dout.copyToHost(), want);
  EXPECT_EQ(joinColumnSlices(dslices.get(), widths, 2, 3, dout.get(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave::cuda
