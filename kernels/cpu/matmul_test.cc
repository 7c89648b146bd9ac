#include "kernels/cpu/matmul.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/quantized_activations.h"

namespace cleave::cpu {
namespace {

using model::TensorType;

uint16_t toHalfBits(float f) {
  // Test data only needs moderate normal values: round-to-nearest via F16C-free math.
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int exponent = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = (x >> 13) & 0x3ff;
  if (exponent <= 0) return static_cast<uint16_t>(sign);
  return static_cast<uint16_t>(sign | (exponent << 10) | mantissa);
}

// `v` rounded to the nearest bf16 (ties to even), as a float: what the bf16 dot kernel
// multiplies in place of an activation.
float roundedToBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  bits &= 0xFFFF0000u;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

// Random weights in `type`: block scales are moderate finite values, quants random.
std::vector<uint8_t> randomWeights(TensorType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<uint8_t> data(rows * *model::tensorBytes(type, cols));
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  auto putHalf = [](uint8_t* p, float v) {
    uint16_t h = toHalfBits(v);
    std::memcpy(p, &h, 2);
  };
  if (type == TensorType::kF32 || type == TensorType::kF16 || type == TensorType::kBF16) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      float v = normal(rng) * 0.1f;
      if (type == TensorType::kF32) std::memcpy(data.data() + 4 * i, &v, 4);
      if (type == TensorType::kF16) putHalf(data.data() + 2 * i, v);
      if (type == TensorType::kBF16) {
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        uint16_t top = static_cast<uint16_t>(bits >> 16);
        std::memcpy(data.data() + 2 * i, &top, 2);
      }
    }
    return data;
  }
  const int64_t block_elements = model::tensorTypeTraits(type)->block_elements;
  const int64_t block_bytes = *model::tensorBytes(type, block_elements);
  for (size_t offset = 0; offset < data.size(); offset += block_bytes) {
    uint8_t* block = data.data() + offset;
    for (int64_t j = 0; j < block_bytes; ++j) block[j] = static_cast<uint8_t>(byte(rng));
    if (type == TensorType::kQ6_K) {
      putHalf(block + 208, scale(rng));  // d comes last.
      continue;
    }
    if (type == TensorType::kMXFP4) {  // An exponent of 2^-9 .. 2^-4 times the twice-valued codes.
      block[0] = static_cast<uint8_t>(119 + rng() % 6);
      continue;
    }
    if (type == TensorType::kNVFP4) {
      // UE4M3 scales of 2^-7 .. 2^-2, bit 7 (ignored) at random; now and then 0x7F (NaN:
      // read as 0) or a subnormal.
      for (int s = 0; s < 4; ++s) {
        const int pick = static_cast<int>(rng() % 16);
        block[s] = pick == 0 ? 0x7F
                   : pick == 1
                       ? static_cast<uint8_t>(1 + rng() % 7)
                       : static_cast<uint8_t>((rng() % 2) << 7 | (1 + rng() % 6) << 3 | rng() % 8);
      }
      continue;
    }
    putHalf(block, (rng() % 2 ? -1.0f : 1.0f) * scale(rng));
    if (type == TensorType::kQ4_1 || type == TensorType::kQ5_1 || type == TensorType::kQ4_K ||
        type == TensorType::kQ5_K) {
      putHalf(block + 2, normal(rng) * 0.01f);
    }
  }
  return data;
}

std::vector<float> dequantized(const WeightMatrix& w) {
  std::vector<float> out(w.rows * w.cols);
  EXPECT_TRUE(model::dequantize(w.type, w.data, w.rows * w.cols, out.data()).ok());
  return out;
}

bool isQuantized(TensorType t) {
  return t == TensorType::kQ4_0 || t == TensorType::kQ4_1 || t == TensorType::kQ8_0 ||
         t == TensorType::kMXFP4;
}

bool isSuperBlock(TensorType t) {
  return t == TensorType::kQ4_K || t == TensorType::kQ5_K || t == TensorType::kQ6_K;
}

struct Shape {
  int64_t rows, cols, tokens;
};

class MatmulTest : public ::testing::TestWithParam<TensorType> {};

// Every ISA path against a float64 reference computed from the dequantized weights and
// the activations as the kernel sees them (after per-block int8 quantization for the
// quantized formats), on fresh random data, awkward sizes and poisoned outputs.
TEST_P(MatmulTest, EveryPathMatchesTheFloat64Reference) {
  const TensorType type = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(type));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool pool(2);
  const Shape shapes[] = {
      {1, 32, 1},
      {37, 64, 1},
      {16, 96, 3},
      {130, 576, 5},
      {33, 1536, 9},
      {70, 160, 17},
      {19, 256, 2},
      {24, 768, 5},
      // Float formats only: rows not of whole vectors (bf16 dots' tails of 4, 18, 13 and 16).
      {29, 100, 3},
      {7, 50, 5},
      {5, 13, 3},
      {3, 48, 2}};
  for (const Shape& s : shapes) {
    if (isSuperBlock(type) && s.cols % 256 != 0) continue;
    if (!model::tensorBytes(type, s.cols)) continue;  // Not whole blocks of this format.
    SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols << " tokens " << s.tokens);
    std::vector<uint8_t> bytes = randomWeights(type, s.rows, s.cols, rng);
    WeightMatrix w{.type = type, .rows = s.rows, .cols = s.cols, .data = bytes.data()};
    std::vector<float> x(s.tokens * s.cols);
    for (float& v : x) v = normal(rng);
    // What the kernel multiplies: x itself, its per-block int8 quantization, or (BF16
    // weights on the bf16 dot kernel) x rounded to bf16.
    const std::vector<double> x_float(x.begin(), x.end());
    std::vector<double> x_bf16(x.size());
    for (size_t i = 0; i < x.size(); ++i) x_bf16[i] = roundedToBf16(x[i]);
    std::vector<double> x_quantized = x_float;
    if (s.cols % 32 == 0) {
      QuantizedActivations q;
      quantizeActivations(x.data(), s.tokens, s.cols, s.cols, q);
      for (int64_t t = 0; t < s.tokens; ++t) {
        for (int64_t k = 0; k < s.cols; ++k) {
          x_quantized[t * s.cols + k] = static_cast<double>(q.rowD(t)[k / 32]) * q.rowQ(t)[k];
        }
      }
    }
    // Q4_K runs as Q4_1 blocks, Q5_x, Q5_K and Q6_K (but on AVX-512) as Q8_0 (matmul.h):
    // int8 activations,
    // and the rewrite's values, read back from the portable path's matrix (packed ones hold
    // no readable copy).
    auto portable = CpuMatrix::create(w, Isa::kPortable);
    ASSERT_TRUE(portable.ok()) << portable.status();
    const bool rewritten = portable->kernelType() != type;
    std::vector<float> wf = dequantized(w);
    std::vector<float> w_seen = wf;
    if (rewritten) {
      w_seen = dequantized(portable->kernelSource());
      // The stored values but for the half rounding of each 32-element block's scale and
      // offset (Q4_K), or within half a Q8_0 step of the block's largest value.
      const float bound = portable->kernelType() == TensorType::kQ4_1 ? 2e-3f : 1.0f / 250;
      for (size_t i = 0; i < wf.size(); ++i) {
        const size_t block = i / 32 * 32;
        float peak = 0;
        for (size_t j = block; j < block + 32; ++j) peak = std::max(peak, std::fabs(wf[j]));
        ASSERT_NEAR(w_seen[i], wf[i], bound * peak + 1e-7f) << i;
      }
    }
    for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512}) {
      if (!isaSupported(isa)) continue;
      SCOPED_TRACE(isaName(isa));
      std::vector<uint8_t> copy = bytes;  // Packing must not keep pointing at the source.
      WeightMatrix source = w;
      source.data = copy.data();
      auto matrix = CpuMatrix::create(source, isa);
      ASSERT_TRUE(matrix.ok()) << matrix.status();
      // Packed or not, source() is what another backend uploads from.
      std::vector<float> uploaded(s.rows * s.cols, std::nanf("poison"));
      ASSERT_TRUE(dequantizeRows(matrix->source(), 0, s.rows, uploaded.data()).ok());
      ASSERT_EQ(uploaded, wf);
      if (matrix->packed()) std::fill(copy.begin(), copy.end(), 0xAB);
      if (type == TensorType::kQ6_K && isa == Isa::kAvx512) {
        EXPECT_EQ(matrix->kernelType(), TensorType::kQ6_K);  // Read as it is, packed.
        EXPECT_TRUE(matrix->packed());
      }
      // The SIMD paths read every int8 format row-interleaved; every path reads NVFP4 so.
      if (isQuantized(matrix->kernelType())) EXPECT_EQ(matrix->packed(), isa != Isa::kPortable);
      if (type == TensorType::kNVFP4) EXPECT_TRUE(matrix->packed());
      const bool int8 = matrix->packed() || isQuantized(matrix->kernelType());
      if (type == TensorType::kBF16 && isa == Isa::kAvx512)
        EXPECT_EQ(matrix->multipliesBf16(), bf16DotsChosen());
      const std::vector<double>& x_seen = int8                       ? x_quantized
                                          : matrix->multipliesBf16() ? x_bf16
                                                                     : x_float;
      // What this path's kernel holds: the stored values (Q6_K on AVX-512), or the rewrite.
      const std::vector<float>& w_kernel = matrix->kernelType() == type ? wf : w_seen;
      std::vector<float> y(s.tokens * s.rows, std::nanf("poison"));
      ASSERT_TRUE(matmul({.weight = &*matrix,
                          .x = x.data(),
                          .ldx = s.cols,
                          .tokens = s.tokens,
                          .y = y.data(),
                          .ldy = s.rows},
                         pool)
                      .ok());
      for (int64_t t = 0; t < s.tokens; ++t) {
        for (int64_t n = 0; n < s.rows; ++n) {
          double ref = 0, magnitude = 0;
          for (int64_t k = 0; k < s.cols; ++k) {
            double term = static_cast<double>(w_kernel[n * s.cols + k]) * x_seen[t * s.cols + k];
            ref += term;
            magnitude += std::fabs(term);
          }
          float got = y[t * s.rows + n];
          ASSERT_FALSE(std::isnan(got)) << "t=" << t << " n=" << n;
          ASSERT_NEAR(got, ref, 2e-6 * magnitude + 1e-7) << "t=" << t << " n=" << n;
        }
      }
    }
  }
}

TEST_P(MatmulTest, ThreadCountDoesNotChangeTheResult) {
  const TensorType type = GetParam();
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> bytes = randomWeights(type, 200, 256, rng);
  WeightMatrix w{
      .type = type, .rows = 200, .cols = 256, .data = bytes.data()};  // 256: every format
  std::vector<float> x(6 * 256);
  for (float& v : x) v = normal(rng);
  std::vector<float> y1(6 * 200, std::nanf("")), y2(6 * 200, std::nanf(""));
  ThreadPool one(1), two(2);
  auto matrix = CpuMatrix::create(w);
  ASSERT_TRUE(matrix.ok()) << matrix.status();
  ASSERT_TRUE(
      matmul(
          {.weight = &*matrix, .x = x.data(), .ldx = 256, .tokens = 6, .y = y1.data(), .ldy = 200},
          one)
          .ok());
  ASSERT_TRUE(
      matmul(
          {.weight = &*matrix, .x = x.data(), .ldx = 256, .tokens = 6, .y = y2.data(), .ldy = 200},
          two)
          .ok());
  EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4));
}

// A token's outputs are the same bits alone as in a batch, wherever it falls in the kernels'
// token tiles: a decode step must not change with the batch it runs in.
TEST_P(MatmulTest, ATokenGetsTheSameBitsAloneAsInABatch) {
  const TensorType type = GetParam();
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rows = 37, cols = 256, tokens = 13;  // A whole tile of every ISA and a tail.
  std::vector<uint8_t> bytes = randomWeights(type, rows, cols, rng);
  WeightMatrix w{.type = type, .rows = rows, .cols = cols, .data = bytes.data()};
  std::vector<float> x(tokens * cols);
  for (float& v : x) v = normal(rng);
  ThreadPool pool(2);
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512}) {
    if (!isaSupported(isa)) continue;
    SCOPED_TRACE(isaName(isa));
    auto matrix = CpuMatrix::create(w, isa);
    ASSERT_TRUE(matrix.ok()) << matrix.status();
    std::vector<float> batch(tokens * rows, std::nanf("")), alone(tokens * rows, std::nanf(""));
    ASSERT_TRUE(matmul({.weight = &*matrix,
                        .x = x.data(),
                        .ldx = cols,
                        .tokens = tokens,
                        .y = batch.data(),
                        .ldy = rows},
                       pool)
                    .ok());
    for (int64_t t = 0; t < tokens; ++t) {
      ASSERT_TRUE(matmul({.weight = &*matrix,
                          .x = x.data() + t * cols,
                          .ldx = cols,
                          .tokens = 1,
                          .y = alone.data() + t * rows,
                          .ldy = rows},
                         pool)
                      .ok());
    }
    EXPECT_EQ(0, std::memcmp(batch.data(), alone.data(), batch.size() * 4));
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, MatmulTest,
                         ::testing::Values(TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ8_0,
                                           TensorType::kF32, TensorType::kF16, TensorType::kBF16,
                                           TensorType::kQ5_0, TensorType::kQ5_1, TensorType::kQ4_K,
                                           TensorType::kQ5_K, TensorType::kQ6_K, TensorType::kMXFP4,
                                           TensorType::kNVFP4),
                         [](const auto& info) {
                           return std::string(model::tensorTypeName(info.param));
                         });

// Products of one input in one call give each product's bits from a call of its own, whatever
// mix of kernels they take (packed int8, float, a Q6_K rewrite), on every path.
TEST(MatmulsOfOneInputTest, GiveTheBitsOfOneCallEach) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t cols = 256, tokens = 11;
  const std::pair<TensorType, int64_t> shapes[] = {{TensorType::kQ4_1, 70},
                                                   {TensorType::kF32, 33},
                                                   {TensorType::kQ6_K, 16},
                                                   {TensorType::kQ8_0, 5},
                                                   {TensorType::kBF16, 9}};
  std::vector<std::vector<uint8_t>> bytes;
  for (const auto& [type, rows] : shapes) bytes.push_back(randomWeights(type, rows, cols, rng));
  std::vector<float> x(tokens * cols);
  for (float& v : x) v = normal(rng);
  ThreadPool pool(2);
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512}) {
    if (!isaSupported(isa)) continue;
    SCOPED_TRACE(isaName(isa));
    std::vector<CpuMatrix> matrices;
    for (size_t i = 0; i < std::size(shapes); ++i) {
      auto m = CpuMatrix::create({.type = shapes[i].first,
                                  .rows = shapes[i].second,
                                  .cols = cols,
                                  .data = bytes[i].data()},
                                 isa);
      ASSERT_TRUE(m.ok()) << m.status();
      matrices.push_back(std::move(*m));
    }
    std::vector<std::vector<float>> together, alone;
    std::vector<MatmulArgs> products;
    for (const CpuMatrix& m : matrices) {
      together.emplace_back(tokens * m.rows(), std::nanf("poison"));
      alone.emplace_back(tokens * m.rows(), std::nanf("poison"));
      products.push_back({.weight = &m,
                          .x = x.data(),
                          .ldx = cols,
                          .tokens = tokens,
                          .y = together.back().data(),
                          .ldy = m.rows()});
    }
    ASSERT_TRUE(matmulsOfOneInput(products, pool).ok());
    for (size_t i = 0; i < products.size(); ++i) {
      MatmulArgs one = products[i];
      one.y = alone[i].data();
      ASSERT_TRUE(matmul(one, pool).ok());
      EXPECT_EQ(0, std::memcmp(together[i].data(), alone[i].data(), alone[i].size() * 4)) << i;
      EXPECT_FALSE(std::isnan(together[i].back())) << i;
    }
    // Products that do not share their input are refused.
    std::vector<float> other = x;
    products[1].x = other.data();
    EXPECT_EQ(matmulsOfOneInput(products, pool).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(QuantizedActivationsTest, EveryPathGivesThePortableBytes) {
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int64_t rows = 5, cols = 192, ld = 200;
  std::vector<float> x(rows * ld);
  for (float& v : x) v = normal(rng);
  for (int64_t k = 32; k < 64; ++k) x[k] = 0.0f;  // A block of zeros: d = 0.
  // A block whose scale is exactly 1 (max 127) and whose other values are halves: ties,
  // which round to even.
  x[64] = 127.0f;
  for (int64_t k = 65; k < 96; ++k) x[k] = static_cast<float>(k - 80) + 0.5f;
  QuantizedActivations portable;
  quantizeActivations(x.data(), rows, cols, ld, portable, Isa::kPortable);
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!isaSupported(isa)) continue;
    SCOPED_TRACE(isaName(isa));
    QuantizedActivations q;
    q.q.assign(rows * cols, 0x55);  // Poisoned: every byte must be written.
    quantizeActivations(x.data(), rows, cols, ld, q, isa);
    EXPECT_EQ(q.q, portable.q);
    EXPECT_EQ(q.d, portable.d);
    EXPECT_EQ(q.sum, portable.sum);
    EXPECT_EQ(q.half_sum, portable.half_sum);
  }
}

TEST(QuantizedActivationsTest, APoolGivesTheSameBytes) {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int64_t rows = 100, cols = 96;  // Runs of 32 rows: three whole and a part.
  std::vector<float> x(rows * cols);
  for (float& v : x) v = normal(rng);
  QuantizedActivations alone, pooled;
  quantizeActivations(x.data(), rows, cols, cols, alone);
  ThreadPool pool(2);
  pooled.q.assign(rows * cols, 0x55);  // Poisoned: every byte must be written.
  pooled.dsum.assign(rows * 3, std::nanf(""));
  quantizeActivations(x.data(), rows, cols, cols, pooled, bestIsa(), &pool);
  EXPECT_EQ(pooled.q, alone.q);
  EXPECT_EQ(pooled.d, alone.d);
  EXPECT_EQ(pooled.sum, alone.sum);
  EXPECT_EQ(pooled.half_sum, alone.half_sum);
  EXPECT_EQ(pooled.dsum, alone.dsum);
}

TEST(QuantizedActivationsTest, ErrorIsBoundedByHalfAStep) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(2 * 96);
  for (float& v : x) v = normal(rng);
  QuantizedActivations q;
  quantizeActivations(x.data(), 2, 96, 96, q);
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t b = 0; b < 3; ++b) {
      int32_t sum = 0, half = 0;
      for (int j = 0; j < 32; ++j) {
        int64_t k = b * 32 + j;
        sum += q.rowQ(t)[k];
        if (j < 16) half += q.rowQ(t)[k];
        EXPECT_LE(std::fabs(q.rowD(t)[b] * q.rowQ(t)[k] - x[t * 96 + k]),
                  0.5f * q.rowD(t)[b] * 1.0001f);
      }
      EXPECT_EQ(sum, q.rowSum(t)[b]);
      EXPECT_EQ(half, q.rowHalfSum(t)[b]);
    }
  }
}

// NVFP4 as safetensors checkpoints hold it (E2M1 codes; a float scale per 16 elements of a
// row and a global one), a tensor-parallel slice of a larger matrix: every path packs it as
// NVFP4 and multiplies int8 activations, but for a slice whose columns do not start on a
// scale group, dequantized a row at a time. Each against float64 of the values.
TEST(MatmulE2M1Test, ScaledSlicesMatchTheFloat64Reference) {
  std::mt19937 rng(4242);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> magnitude(0.01f, 2.0f);
  ThreadPool pool(2);
  const int64_t full_rows = 45, full_cols = 352, tokens = 7;
  std::vector<uint8_t> codes(full_rows * full_cols / 2);
  for (uint8_t& b : codes) b = static_cast<uint8_t>(rng());
  std::vector<float> grid(full_rows * full_cols / 16);
  for (float& g : grid) g = magnitude(rng);
  struct Slice {
    int64_t row_offset, col_offset, rows, cols;
    bool packs;
  };
  for (const Slice& slice : {Slice{0, 0, 45, 352, true}, Slice{3, 64, 37, 256, true},
                             Slice{16, 16, 29, 320, true}, Slice{1, 8, 20, 320, false}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << slice.row_offset << "+" << slice.rows
                                      << " cols " << slice.col_offset << "+" << slice.cols);
    // The slice's codes, rows of cols / 2 bytes; its scales stay in the whole grid.
    std::vector<uint8_t> bytes(slice.rows * slice.cols / 2);
    for (int64_t r = 0; r < slice.rows; ++r) {
      std::memcpy(bytes.data() + r * slice.cols / 2,
                  codes.data() + (slice.row_offset + r) * full_cols / 2 + slice.col_offset / 2,
                  slice.cols / 2);
    }
    const WeightMatrix w{.type = TensorType::kE2M1,
                         .rows = slice.rows,
                         .cols = slice.cols,
                         .data = bytes.data(),
                         .scales = {.data = grid.data(),
                                    .block_rows = 1,
                                    .block_cols = 16,
                                    .cols = full_cols / 16,
                                    .row_offset = slice.row_offset,
                                    .col_offset = slice.col_offset,
                                    .global = 0.0371f}};
    std::vector<float> wf(slice.rows * slice.cols, std::nanf("poison"));
    ASSERT_TRUE(dequantizeRows(w, 0, slice.rows, wf.data()).ok());
    std::vector<float> x(tokens * slice.cols);
    for (float& v : x) v = normal(rng);
    QuantizedActivations q;
    quantizeActivations(x.data(), tokens, slice.cols, slice.cols, q);
    for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512}) {
      if (!isaSupported(isa)) continue;
      SCOPED_TRACE(isaName(isa));
      auto matrix = CpuMatrix::create(w, isa);
      ASSERT_TRUE(matrix.ok()) << matrix.status();
      const bool packed = slice.packs;
      ASSERT_EQ(matrix->packed(), packed);
      if (packed) EXPECT_EQ(matrix->kernelType(), TensorType::kNVFP4);
      std::vector<float> y(tokens * slice.rows, std::nanf("poison"));
      ASSERT_TRUE(matmul({.weight = &*matrix,
                          .x = x.data(),
                          .ldx = slice.cols,
                          .tokens = tokens,
                          .y = y.data(),
                          .ldy = slice.rows},
                         pool)
                      .ok());
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t n = 0; n < slice.rows; ++n) {
          double ref = 0, size = 0;
          for (int64_t k = 0; k < slice.cols; ++k) {
            const double xk = packed ? static_cast<double>(q.rowD(t)[k / 32]) * q.rowQ(t)[k]
                                     : static_cast<double>(x[t * slice.cols + k]);
            const double term = static_cast<double>(wf[n * slice.cols + k]) * xk;
            ref += term;
            size += std::fabs(term);
          }
          const float got = y[t * slice.rows + n];
          ASSERT_FALSE(std::isnan(got)) << "t=" << t << " n=" << n;
          ASSERT_NEAR(got, ref, 2e-6 * size + 1e-7) << "t=" << t << " n=" << n;
        }
      }
    }
  }
}

// A matrix kept as stored (for another backend to copy) is neither rewritten nor packed, holds
// only its source's bytes, and still multiplies right: the int8 formats a row at a time, every
// other block format dequantized, float activations.
TEST(MatmulAsStoredTest, MultipliesTheStoredFormat) {
  std::mt19937 rng(77);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool pool(2);
  const int64_t rows = 37, cols = 256, tokens = 5;
  std::vector<float> x(tokens * cols);
  for (float& v : x) v = normal(rng);
  QuantizedActivations q;
  quantizeActivations(x.data(), tokens, cols, cols, q);
  for (TensorType type :
       {TensorType::kQ4_0, TensorType::kQ8_0, TensorType::kMXFP4, TensorType::kNVFP4,
        TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K, TensorType::kBF16}) {
    SCOPED_TRACE(model::tensorTypeName(type));
    std::vector<uint8_t> bytes = randomWeights(type, rows, cols, rng);
    const WeightMatrix w{.type = type, .rows = rows, .cols = cols, .data = bytes.data()};
    auto matrix = CpuMatrix::asStored(w, nullptr);
    ASSERT_TRUE(matrix.ok()) << matrix.status();
    EXPECT_FALSE(matrix->packed());
    EXPECT_EQ(matrix->kernelType(), type);
    EXPECT_EQ(matrix->bytes(), static_cast<int64_t>(bytes.size()));
    const std::vector<float> wf = dequantized(w);
    std::vector<float> y(tokens * rows, std::nanf("poison"));
    ASSERT_TRUE(matmul({.weight = &*matrix,
                        .x = x.data(),
                        .ldx = cols,
                        .tokens = tokens,
                        .y = y.data(),
                        .ldy = rows},
                       pool)
                    .ok());
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t n = 0; n < rows; ++n) {
        double ref = 0, size = 0;
        for (int64_t k = 0; k < cols; ++k) {
          const double xk = isQuantized(type)
                                ? static_cast<double>(q.rowD(t)[k / 32]) * q.rowQ(t)[k]
                            : matrix->multipliesBf16() ? roundedToBf16(x[t * cols + k])
                                                       : static_cast<double>(x[t * cols + k]);
          const double term = static_cast<double>(wf[n * cols + k]) * xk;
          ref += term;
          size += std::fabs(term);
        }
        ASSERT_NEAR(y[t * rows + n], ref, 2e-6 * size + 1e-7) << "t=" << t << " n=" << n;
      }
    }
  }
  EXPECT_FALSE(
      CpuMatrix::asStored({.type = TensorType::kQ4_0, .rows = 2, .cols = 30}, nullptr).ok());
}

// A packed matrix that drops its source (the loader's own copy) multiplies as before, holds
// its packed bytes only, and refuses to be dequantized for another backend; an unpacked one
// keeps its source.
TEST(MatmulDropSourceTest, APackedMatrixKeepsOnlyItsPackedCopy) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  const int64_t rows = 40, cols = 128, tokens = 3;
  auto bytes =
      std::make_shared<std::vector<uint8_t>>(randomWeights(TensorType::kMXFP4, rows, cols, rng));
  const WeightMatrix w{
      .type = TensorType::kMXFP4, .rows = rows, .cols = cols, .data = bytes->data()};
  std::vector<float> x(tokens * cols), before(tokens * rows), after(tokens * rows, std::nanf(""));
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512}) {
    if (!isaSupported(isa)) continue;
    auto m = CpuMatrix::create(w, bytes, isa);
    ASSERT_TRUE(m.ok()) << m.status();
    const MatmulArgs args{.weight = &*m, .x = x.data(), .ldx = cols, .tokens = tokens, .ldy = rows};
    MatmulArgs first = args, second = args;
    first.y = before.data();
    second.y = after.data();
    ASSERT_TRUE(matmul(first, pool).ok());
    m->dropSource();
    ASSERT_TRUE(matmul(second, pool).ok());
    EXPECT_EQ(0, std::memcmp(before.data(), after.data(), before.size() * 4)) << isaName(isa);
    std::vector<float> row(cols);
    EXPECT_EQ(dequantizeRows(m->source(), 0, 1, row.data()).ok(), !m->packed()) << isaName(isa);
    EXPECT_EQ(m->source().data != nullptr, !m->packed());
  }
}

TEST(MatmulErrorsTest, UnsupportedFormatsAndShapes) {
  std::vector<uint8_t> bytes(1024);
  WeightMatrix q2k{.type = TensorType::kQ2_K, .rows = 1, .cols = 256, .data = bytes.data()};
  EXPECT_EQ(CpuMatrix::create(q2k).status().code(), absl::StatusCode::kUnimplemented);
  WeightMatrix odd{.type = TensorType::kQ8_0, .rows = 1, .cols = 48, .data = bytes.data()};
  EXPECT_EQ(CpuMatrix::create(odd).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave::cpu
