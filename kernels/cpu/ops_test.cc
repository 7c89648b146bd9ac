// RMSNorm, SiLU-and-mul, softmax, RoPE and attention against float64 references on
// random inputs with poisoned outputs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include <cstring>
#include <fstream>
#include <limits>

#include "common/model/dequant_kernels.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/kv_format.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/vector_ops.h"
#include "nlohmann/json.hpp"

namespace cleave::cpu {
namespace {

std::vector<float> randomVector(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(ElementwiseTest, RmsNormGatedActivationsSoftCapAndSoftmaxMatchFloat64) {
  std::mt19937 rng(11);
  const int64_t rows = 3, cols = 577;
  std::vector<float> x = randomVector(rows * cols, rng, 3.0f), w = randomVector(cols, rng);
  std::vector<float> y(rows * cols, std::nanf(""));
  rmsNorm(x.data(), cols, w.data(), rows, cols, 1e-5f, y.data(), cols);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < cols; ++i) ms += double(x[r * cols + i]) * x[r * cols + i];
    double scale = 1.0 / std::sqrt(ms / cols + 1e-5);
    for (int64_t i = 0; i < cols; ++i)
      ASSERT_NEAR(y[r * cols + i], x[r * cols + i] * scale * w[i], 1e-5);
  }
  std::vector<float> gate = randomVector(cols, rng, 4.0f), up = randomVector(cols, rng),
                     out(cols, std::nanf(""));
  siluMul(gate.data(), up.data(), cols, 1, cols, out.data(), cols);
  for (int64_t i = 0; i < cols; ++i) {
    double g = gate[i];
    ASSERT_NEAR(out[i], g / (1 + std::exp(-g)) * up[i], 1e-5 * (1 + std::fabs(g * up[i])));
  }
  geluTanhMul(gate.data(), up.data(), cols, 1, cols, out.data(), cols);
  for (int64_t i = 0; i < cols; ++i) {
    const double g = gate[i];
    const double gelu = 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
    ASSERT_NEAR(out[i], gelu * up[i], 1e-5 * (1 + std::fabs(g * up[i])));
  }
  std::vector<float> capped = randomVector(cols, rng, 40.0f);
  const std::vector<float> uncapped = capped;
  softCap(capped.data(), cols, 30.0f);
  for (int64_t i = 0; i < cols; ++i)
    ASSERT_NEAR(capped[i], 30.0 * std::tanh(uncapped[i] / 30.0), 1e-5);
  std::vector<float> s = randomVector(cols, rng, 10.0f), ref(s.begin(), s.end());
  softmax(s.data(), cols, 1, cols);
  double peak = *std::max_element(ref.begin(), ref.end()), total = 0;
  for (float v : ref) total += std::exp(v - peak);
  for (int64_t i = 0; i < cols; ++i) ASSERT_NEAR(s[i], std::exp(ref[i] - peak) / total, 1e-6);
}

TEST(VectorOpsTest, ExpIsAccurateAcrossItsRange) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> range(-87.0f, 80.0f);  // The sum stays finite.
  std::vector<float> x(1003);
  for (float& v : x) v = range(rng);
  x[0] = 0.0f;
  x[1] = -1e-8f;
  std::vector<float> y = x;
  const float sum = expShiftSum(y.data(), static_cast<int64_t>(y.size()), 0.0f);
  double ref_sum = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = std::exp(double(x[i]));
    ref_sum += ref;
    ASSERT_NEAR(y[i], ref, 4e-7 * ref) << "x=" << x[i];
  }
  EXPECT_NEAR(sum, ref_sum, 1e-5 * ref_sum);
  std::vector<float> far = {-200.0f, -100.0f, 100.0f};
  expShiftSum(far.data(), 3, 0.0f);
  EXPECT_EQ(far[0], 0.0f);
  EXPECT_LT(far[1], 1e-37f);
  EXPECT_TRUE(std::isinf(far[2]) || far[2] > 1e38f);
}

model::ModelConfig ropeConfig(int head_dim) {
  model::ModelConfig c;
  c.head_dim = head_dim;
  c.rope_theta = 10000.0;
  return c;
}

TEST(RopeTest, AdjacentPairingIsHalvesPairingOnPermutedDimensions) {
  std::mt19937 rng(3);
  const int64_t d = 64, heads = 3;
  Rope halves(ropeConfig(d), RopePairing::kHalves), adjacent(ropeConfig(d), RopePairing::kAdjacent);
  std::vector<float> x = randomVector(heads * d, rng);
  std::vector<float> permuted(x.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < d / 2; ++i) {
      permuted[h * d + 2 * i] = x[h * d + i];
      permuted[h * d + 2 * i + 1] = x[h * d + i + d / 2];
    }
  }
  const int32_t position = 37;
  halves.apply(x.data(), heads * d, 1, heads, &position);
  adjacent.apply(permuted.data(), heads * d, 1, heads, &position);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < d / 2; ++i) {
      EXPECT_FLOAT_EQ(permuted[h * d + 2 * i], x[h * d + i]);
      EXPECT_FLOAT_EQ(permuted[h * d + 2 * i + 1], x[h * d + i + d / 2]);
    }
  }
}

TEST(RopeTest, RotatesByPositionTimesFrequency) {
  const int64_t d = 8;
  Rope rope(ropeConfig(d), RopePairing::kHalves);
  std::vector<float> x = {1, 0, 0, 0, 0, 0, 0, 0};  // Pair 0 = (1, 0).
  const int32_t position = 5;
  rope.apply(x.data(), d, 1, 1, &position);
  EXPECT_NEAR(x[0], std::cos(5.0), 1e-6);
  EXPECT_NEAR(x[4], std::sin(5.0), 1e-6);
  EXPECT_NEAR(rope.inverseFrequencies()[1], std::pow(10000.0, -2.0 / 8), 1e-7);
}

TEST(RopeTest, Llama3ScalingKeepsHighAndSlowsLowFrequencies) {
  model::ModelConfig c = ropeConfig(128);
  c.rope_theta = 500000.0;
  c.rope_scaling = {.type = "llama3",
                    .factor = 8.0,
                    .low_freq_factor = 1.0,
                    .high_freq_factor = 4.0,
                    .original_max_position_embeddings = 8192};
  Rope scaled(c, RopePairing::kHalves), plain(ropeConfig(128), RopePairing::kHalves);
  c.rope_scaling = {};
  Rope unscaled(c, RopePairing::kHalves);
  const auto& s = scaled.inverseFrequencies();
  const auto& u = unscaled.inverseFrequencies();
  EXPECT_FLOAT_EQ(s[0], u[0]);           // Wavelength 2*pi: untouched.
  EXPECT_FLOAT_EQ(s[63], u[63] / 8.0f);  // Longest wavelength: divided by the factor.
  for (size_t i = 1; i < s.size(); ++i) EXPECT_LE(s[i], u[i] * 1.0000001f);
  EXPECT_TRUE(ropeSupported({.type = "llama3"}).ok());
  EXPECT_TRUE(ropeSupported({.type = "yarn"}).ok());
  EXPECT_FALSE(ropeSupported({.type = "dynamic"}).ok());
}

// longrope: each pair's frequency over its long factor when the context served is longer
// than the original, else over its short one, at every position; cos and sin times the
// attention factor either way.
TEST(RopeTest, LongropeChoosesItsFactorsByTheServedContext) {
  model::ModelConfig c = ropeConfig(8);
  c.rope_scaling = {.type = "longrope",
                    .original_max_position_embeddings = 4096,
                    .attention_factor = 1.25,
                    .short_factor = {1, 2, 3, 4},
                    .long_factor = {5, 6, 7, 8}};
  c.max_position_embeddings = 4096;
  const Rope short_rope(c, RopePairing::kHalves);
  c.max_position_embeddings = 4097;
  const Rope long_rope(c, RopePairing::kHalves);
  for (int i = 0; i < 4; ++i) {
    const double plain = std::pow(10000.0, -2.0 * i / 8);
    EXPECT_FLOAT_EQ(short_rope.inverseFrequencies()[i], static_cast<float>(plain / (1 + i))) << i;
    EXPECT_FLOAT_EQ(long_rope.inverseFrequencies()[i], static_cast<float>(plain / (5 + i))) << i;
  }
  EXPECT_EQ(short_rope.attentionFactor(), 1.25);
  EXPECT_EQ(long_rope.attentionFactor(), 1.25);
  std::vector<float> x = {1, 0, 0, 0, 0, 0, 0, 0};
  const int32_t position = 3;
  long_rope.apply(x.data(), 8, 1, 1, &position);
  EXPECT_NEAR(x[0], 1.25 * std::cos(3.0 / 5), 1e-6);
  EXPECT_NEAR(x[4], 1.25 * std::sin(3.0 / 5), 1e-6);
  EXPECT_TRUE(ropeSupported({.type = "longrope"}).ok());
}

// Tokens at positions [start, start + tokens) of a sequence whose blocks are `blocks`; it has
// written positions [0, start + tokens) (a cached prefix, then these).
struct Chunk {
  std::vector<int32_t> blocks;
  int32_t start = 0;
  int32_t tokens = 1;
};

// Paged causal GQA attention of `chunks` (one batch, in order) over a cache of `type` (e4m3
// with scales 0.5 for keys and 2 for values) against float64 over the values the cache holds
// (decoded), and each token computed alone against the batch, bit for bit. Every cache row no
// chunk has written is NaN, so reading one shows.
// With `window` > 0 a token attends to its last `window` positions only; with `sinks`, each
// head's softmax has a sink logit (random, around the scores' scale).
struct AttentionVariant {
  int64_t window = 0;
  bool sinks = false;
  float softcap = 0;  // Gemma 2: scores capped to ±softcap
};

void checkPagedAttention(KvType type, int64_t d, int64_t heads, int64_t kv_heads,
                         int64_t block_size, int64_t pool_blocks, const std::vector<Chunk>& chunks,
                         float scale, AttentionVariant variant = {}) {
  SCOPED_TRACE(testing::Message() << kvTypeName(type) << " d " << d << " heads " << heads << "/"
                                  << kv_heads << " block " << block_size << " window "
                                  << variant.window << (variant.sinks ? " sinks" : "")
                                  << " softcap " << variant.softcap);
  std::mt19937 rng(17 + static_cast<int>(type) + static_cast<int>(d + heads + block_size));
  const int64_t row = kv_heads * d;
  std::vector<int32_t> positions;
  std::vector<const int32_t*> tables;
  std::vector<int64_t> written(pool_blocks, 0);  // Positions of each block written.
  for (const Chunk& c : chunks) {
    for (int32_t i = 0; i < c.tokens; ++i) {
      positions.push_back(c.start + i);
      tables.push_back(c.blocks.data());
    }
    const int64_t end = c.start + c.tokens;
    for (int64_t j = 0; j * block_size < end; ++j)
      written[c.blocks[j]] =
          std::max(written[c.blocks[j]], std::min(block_size, end - j * block_size));
  }
  const int64_t tokens = static_cast<int64_t>(positions.size());
  const float k_scale = 0.5f, v_scale = 2.0f;
  std::vector<float> q = randomVector(tokens * heads * d, rng);
  std::vector<float> k = randomVector(pool_blocks * block_size * row, rng);
  std::vector<float> v = randomVector(pool_blocks * block_size * row, rng);
  // The cache as stored, and the values it holds; rows not written are NaN.
  const int64_t n = static_cast<int64_t>(k.size()), bytes = kvElementBytes(type);
  std::vector<uint8_t> k_stored(n * bytes), v_stored(n * bytes);
  encodeKv(type, k.data(), n, k_scale, k_stored.data());
  encodeKv(type, v.data(), n, v_scale, v_stored.data());
  decodeKv(type, k_stored.data(), n, k_scale, k.data());
  decodeKv(type, v_stored.data(), n, v_scale, v.data());
  const std::vector<float> nan_row(d, std::nanf(""));
  for (int64_t b = 0; b < pool_blocks; ++b) {
    for (int64_t h = 0; h < kv_heads; ++h) {
      for (int64_t slot = written[b]; slot < block_size; ++slot) {
        const int64_t at = ((b * kv_heads + h) * block_size + slot) * d;
        encodeKv(type, nan_row.data(), d, 1.0f, &k_stored[at * bytes]);
        encodeKv(type, nan_row.data(), d, 1.0f, &v_stored[at * bytes]);
      }
    }
  }
  std::vector<float> sinks = randomVector(heads, rng);
  for (float& x : sinks) x *= 2.0f;
  std::vector<float> out(tokens * heads * d, std::nanf(""));
  ThreadPool pool(2);
  const AttentionArgs args{.q = q.data(),
                           .ldq = heads * d,
                           .tokens = tokens,
                           .positions = positions.data(),
                           .block_tables = tables.data(),
                           .k_pool = k_stored.data(),
                           .v_pool = v_stored.data(),
                           .kv_type = type,
                           .k_scale = k_scale,
                           .v_scale = v_scale,
                           .block_size = block_size,
                           .heads = heads,
                           .kv_heads = kv_heads,
                           .head_dim = d,
                           .scale = scale,
                           .sinks = variant.sinks ? sinks.data() : nullptr,
                           .softcap = variant.softcap,
                           .window = variant.window,
                           .out = out.data(),
                           .ldo = heads * d};
  attention(args, pool);
  // Each token on its own (as a decode step computes it) gives the same bits.
  std::vector<float> alone(tokens * heads * d, std::nanf(""));
  for (int64_t t = 0; t < tokens; ++t) {
    AttentionArgs one = args;
    one.q = q.data() + t * heads * d;
    one.tokens = 1;
    one.positions = &positions[t];
    one.block_tables = &tables[t];
    one.out = alone.data() + t * heads * d;
    attention(one, pool);
  }
  ASSERT_EQ(std::memcmp(out.data(), alone.data(), out.size() * sizeof(float)), 0)
      << "a token alone and in its batch differ";
  for (int64_t t = 0; t < tokens; ++t) {
    auto rowAt = [&](const std::vector<float>& base, int64_t p, int64_t kvh) {
      return &base[((tables[t][p / block_size] * kv_heads + kvh) * block_size + p % block_size) *
                   d];
    };
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kvh = h / (heads / kv_heads);
      const int64_t from =
          variant.window > 0 ? std::max<int64_t>(0, positions[t] - variant.window + 1) : 0;
      std::vector<double> p(positions[t] + 1, 0.0);
      double peak = variant.sinks ? sinks[h] : -1e300, total = 0;
      for (int64_t j = from; j <= positions[t]; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e)
          dot += double(q[(t * heads + h) * d + e]) * rowAt(k, j, kvh)[e];
        p[j] = dot * scale;
        if (variant.softcap > 0) p[j] = variant.softcap * std::tanh(p[j] / variant.softcap);
        peak = std::max(peak, p[j]);
      }
      for (int64_t j = from; j <= positions[t]; ++j) total += (p[j] = std::exp(p[j] - peak));
      if (variant.sinks) total += std::exp(sinks[h] - peak);
      for (int64_t e = 0; e < d; ++e) {
        double ref = 0;
        for (int64_t j = from; j <= positions[t]; ++j) ref += p[j] / total * rowAt(v, j, kvh)[e];
        ASSERT_NEAR(out[(t * heads + h) * d + e], ref, 2e-5)
            << "token " << t << " (position " << positions[t] << ") head " << h << " dim " << e;
      }
    }
  }
}

// Decode-like tokens: head_dim 16 to 256 take the widest SIMD kernel the machine has, 8 the
// AVX2 one (where there is AVX2), 12 the portable one; groups of 3 and 8 query heads per KV
// head, so the accumulators go in one chunk, several with a partial last one, or a head at a
// time. Sequence A owns blocks 7, 2, 5, 0 and has tokens at positions 3 and 12 (not one run);
// B owns blocks 3, 8 and has a run at positions 4, 5 (8 heads a group: one tile of 16 rows).
TEST(AttentionTest, PagedCausalGqaMatchesFloat64ForEveryCacheType) {
  const std::vector<int32_t> a = {7, 2, 5, 0}, b = {3, 8};
  for (KvType type : {KvType::kF32, KvType::kBf16, KvType::kFp8E4M3}) {
    for (int64_t d : {8, 12, 16, 32, 64, 128, 256}) {
      for (int64_t heads : {6, 16}) {
        checkPagedAttention(type, d, heads, 2, 4, 9, {{a, 12, 1}, {a, 3, 1}, {b, 4, 2}}, 0.25f);
      }
    }
  }
}

// Prefill chunks (runs of consecutive positions, computed as tiles of query rows): after a
// cached prefix (A: 37 tokens from position 20), from the start over many blocks (B: 70), short
// (C: 5), next to a decoding token (D) in one batch; groups of 1, 3, 4 and 8 query heads per KV
// head (tiles cutting a token's heads apart), block sizes shorter and longer than a vector.
TEST(AttentionTest, PrefillChunksMatchFloat64ForEveryCacheType) {
  std::mt19937 rng(5);
  for (KvType type : {KvType::kF32, KvType::kBf16, KvType::kFp8E4M3}) {
    for (int64_t block_size : {4, 16, 32}) {
      const int64_t per_sequence = (57 + 13 + block_size - 1) / block_size;  // Room for 70.
      std::vector<int32_t> order(4 * per_sequence);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      auto blocks = [&](int s) {
        return std::vector<int32_t>(order.begin() + s * per_sequence,
                                    order.begin() + (s + 1) * per_sequence);
      };
      const std::vector<Chunk> chunks = {
          {blocks(0), 20, 37}, {blocks(1), 0, 70}, {blocks(2), 0, 5}, {blocks(3), 9, 1}};
      for (int64_t d : {64, 128}) {
        for (auto [heads, kv_heads] : {std::pair{4, 4}, {6, 2}, {9, 3}, {8, 2}, {16, 2}}) {
          checkPagedAttention(type, d, heads, kv_heads, block_size, 4 * per_sequence, chunks,
                              1.0f / std::sqrt(static_cast<float>(d)));
        }
      }
    }
  }
  checkPagedAttention(KvType::kF32, 32, 6, 2, 16, 8, {{{3, 1, 6, 0, 7}, 0, 70}}, 0.3f);
}

// gpt-oss attention: sliding windows (shorter than a chunk of keys, across chunks, longer than
// the context) and per-head sinks, alone and together; Gemma 2's soft-capped scores (a cap of
// 0.5 binds: the scores reach about ±2), alone and with a window; for decoding tokens and
// prefill tiles on every kernel (head_dim 12: portable; 8: AVX2; 64: the widest); a token alone
// agrees with its tile bit for bit, as without them.
TEST(AttentionTest, SlidingWindowsSinksAndSoftCapsMatchFloat64) {
  std::mt19937 rng(11);
  std::vector<int32_t> order(24);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const std::vector<int32_t> a(order.begin(), order.begin() + 12),
      b(order.begin() + 12, order.end());
  const std::vector<Chunk> chunks = {{a, 30, 41}, {b, 0, 9}, {b, 60, 1}, {a, 75, 1}};
  for (KvType type : {KvType::kF32, KvType::kBf16, KvType::kFp8E4M3}) {
    for (int64_t d : {8, 12, 64}) {
      for (AttentionVariant variant :
           {AttentionVariant{.window = 5}, AttentionVariant{.window = 21},
            AttentionVariant{.window = 500}, AttentionVariant{.sinks = true},
            AttentionVariant{.window = 7, .sinks = true}, AttentionVariant{.softcap = 0.5f},
            AttentionVariant{.window = 7, .softcap = 0.5f}}) {
        checkPagedAttention(type, d, 8, 2, 8, 24, chunks, 0.3f, variant);
      }
    }
  }
}

// Codes as ml_dtypes rounds (tests/golden/gen_kv_format.py): nearest, ties to even.
TEST(KvFormatTest, EncodesAsTheReferenceRounds) {
  std::ifstream in(std::string(CLEAVE_GOLDEN_DIR) + "/kv_format/codes.json");
  ASSERT_TRUE(in) << "missing golden: run tests/golden/gen_kv_format.py";
  const nlohmann::json golden = nlohmann::json::parse(in);
  const auto& bits = golden["input_bits"];
  ASSERT_GT(bits.size(), 1000u);
  int subnormal = 0;
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint32_t b = bits[i].get<uint32_t>();
    float x;
    std::memcpy(&x, &b, sizeof(x));
    ASSERT_EQ(floatToBf16(x), golden["bf16"][i].get<uint16_t>()) << x;
    ASSERT_EQ(floatToE4m3(x), golden["e4m3"][i].get<uint8_t>()) << x;
    subnormal += (golden["e4m3"][i].get<uint8_t>() & 0x78) == 0;
  }
  EXPECT_GT(subnormal, 100);  // The subnormal range is covered.
}

TEST(KvFormatTest, E4m3SaturatesAndKeepsNan) {
  EXPECT_EQ(floatToE4m3(448.0f), 0x7E);
  EXPECT_EQ(floatToE4m3(465.0f), 0x7E);
  EXPECT_EQ(floatToE4m3(-1e9f), 0xFE);
  EXPECT_EQ(floatToE4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(floatToE4m3(std::nanf("")) & 0x7F, 0x7F);
  EXPECT_TRUE(std::isnan(model::dequant::bf16ToFloat(floatToBf16(std::nanf("")))));
  // encodeKv divides by the scale; decodeKv multiplies.
  const float x[3] = {3.0f, -100.0f, 0.01f};
  uint8_t codes[3];
  float back[3];
  encodeKv(KvType::kFp8E4M3, x, 3, 0.25f, codes);
  EXPECT_EQ(codes[0], floatToE4m3(12.0f));
  EXPECT_EQ(codes[1], 0xFC);  // -400: halfway between -384 and -416, to the even -384.
  decodeKv(KvType::kFp8E4M3, codes, 3, 0.25f, back);
  EXPECT_EQ(back[0], 3.0f);
  EXPECT_NEAR(back[2], 0.01f, 0.01f * 0.07f);
  EXPECT_EQ(parseKvType("fp8").value(), KvType::kFp8E4M3);
  EXPECT_EQ(parseKvType("bf16").value(), KvType::kBf16);
  EXPECT_FALSE(parseKvType("int8").ok());
}

}  // namespace
}  // namespace cleave::cpu
