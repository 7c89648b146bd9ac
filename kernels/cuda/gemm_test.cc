// cuBLASLt products against the CPU backend's matmul on the same bf16 weights: awkward
// token counts and widths, bias, bf16 and f32 outputs, strided rows.
#include "kernels/cuda/gemm.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/matmul.h"
#include "kernels/cuda/cuda_test_util.h"

namespace cleave::cuda {
namespace {

using testing::bf16;
using testing::DeviceBuffer;

TEST(GemmTest, MatchesCpuBackend) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  auto gemm = Gemm::create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  cpu::ThreadPool pool(2);
  struct Shape {
    int64_t tokens, out, in;
    bool bias, y_float;
  };
  for (const Shape& s : {Shape{1, 576, 576, false, false}, Shape{7, 1536, 576, true, false},
                         Shape{16, 4104, 1024, false, true}, Shape{64, 960, 2048, true, true},
                         Shape{333, 576, 1536, false, false}}) {
    SCOPED_TRACE(::testing::Message() << s.tokens << "x" << s.out << "x" << s.in);
    const int64_t x_stride = s.in + 8, y_stride = s.out + 16;  // Rows apart from each other.
    std::vector<bf16> x = testing::randomBf16(s.tokens * x_stride, rng);
    std::vector<bf16> w = testing::randomBf16(s.out * s.in, rng, 0.05f);
    std::vector<bf16> bias = testing::randomBf16(s.out, rng);
    auto matrix = cpu::CpuMatrix::create({.type = model::TensorType::kBF16,
                                          .rows = s.out,
                                          .cols = s.in,
                                          .data = reinterpret_cast<const uint8_t*>(w.data())});
    ASSERT_TRUE(matrix.ok()) << matrix.status();
    std::vector<float> xf = testing::toFloat(x), want(s.tokens * s.out);
    ASSERT_TRUE(cpu::matmul({.weight = &*matrix,
                             .x = xf.data(),
                             .ldx = x_stride,
                             .tokens = s.tokens,
                             .y = want.data(),
                             .ldy = s.out},
                            pool)
                    .ok());
    if (s.bias)
      for (int64_t t = 0; t < s.tokens; ++t)
        for (int64_t n = 0; n < s.out; ++n) want[t * s.out + n] += testing::toFloat(bias[n]);

    DeviceBuffer<bf16> dx(x), dw(w), dbias(bias);
    DeviceBuffer<bf16> dy16(s.tokens * y_stride);
    DeviceBuffer<float> dy32(s.tokens * y_stride);
    absl::Status run = (*gemm)->run({.x = dx.get(),
                                     .x_stride = x_stride,
                                     .w = dw.get(),
                                     .bias = s.bias ? dbias.get() : nullptr,
                                     .tokens = s.tokens,
                                     .out = s.out,
                                     .in = s.in,
                                     .y = s.y_float ? static_cast<void*>(dy32.get()) : dy16.get(),
                                     .y_stride = y_stride,
                                     .y_float = s.y_float},
                                    nullptr);
    ASSERT_TRUE(run.ok()) << run;
    CUDA_ASSERT_OK(cudaDeviceSynchronize());
    std::vector<float> all = s.y_float ? dy32.copyToHost() : testing::toFloat(dy16.copyToHost());
    std::vector<float> got;
    for (int64_t t = 0; t < s.tokens; ++t)
      got.insert(got.end(), all.begin() + t * y_stride, all.begin() + t * y_stride + s.out);
    const auto d = testing::compare(got, want);
    EXPECT_EQ(d.non_finite, 0);
    EXPECT_LE(d.relative_l2, s.y_float ? 1e-4 : 8e-3);
  }
}

// A strided batch (one small matrix per attention head, as MLA's absorbed products use
// it): the inputs and outputs of consecutive heads interleave in the rows, the matrices are
// stacked; every head's product against the CPU's, outputs poisoned first and the gaps
// between heads left untouched.
TEST(GemmTest, StridedBatchMatchesOneProductPerHead) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  auto gemm = Gemm::create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  cpu::ThreadPool pool(2);
  const int64_t heads = 5, tokens = 9, in = 24, out = 40;
  const int64_t x_head = 32, y_head = 48;  // Each head's columns in a row, with a gap.
  const int64_t x_stride = heads * x_head, y_stride = heads * y_head;
  std::vector<bf16> x = testing::randomBf16(tokens * x_stride, rng);
  std::vector<bf16> w = testing::randomBf16(heads * out * in, rng, 0.1f);
  DeviceBuffer<bf16> dx(x), dw(w);
  DeviceBuffer<bf16> dy(tokens * y_stride);  // Poisoned: NaN.
  absl::Status run = (*gemm)->run({.x = dx.get(),
                                   .x_stride = x_stride,
                                   .w = dw.get(),
                                   .tokens = tokens,
                                   .out = out,
                                   .in = in,
                                   .y = dy.get(),
                                   .y_stride = y_stride,
                                   .batch = static_cast<int>(heads),
                                   .x_batch = x_head,
                                   .w_batch = out * in,
                                   .y_batch = y_head},
                                  nullptr);
  ASSERT_TRUE(run.ok()) << run;
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<float> all = testing::toFloat(dy.copyToHost());
  const std::vector<float> xf = testing::toFloat(x);
  for (int64_t h = 0; h < heads; ++h) {
    SCOPED_TRACE(::testing::Message() << "head " << h);
    auto matrix =
        cpu::CpuMatrix::create({.type = model::TensorType::kBF16,
                                .rows = out,
                                .cols = in,
                                .data = reinterpret_cast<const uint8_t*>(w.data() + h * out * in)});
    ASSERT_TRUE(matrix.ok()) << matrix.status();
    std::vector<float> want(tokens * out), got;
    ASSERT_TRUE(cpu::matmul({.weight = &*matrix,
                             .x = xf.data() + h * x_head,
                             .ldx = x_stride,
                             .tokens = tokens,
                             .y = want.data(),
                             .ldy = out},
                            pool)
                    .ok());
    int64_t gap_nan = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      const float* row = all.data() + t * y_stride + h * y_head;
      got.insert(got.end(), row, row + out);
      for (int64_t i = out; i < y_head; ++i) gap_nan += std::isnan(row[i]);
    }
    const auto d = testing::compare(got, want);
    EXPECT_EQ(d.non_finite, 0);
    EXPECT_LE(d.relative_l2, 8e-3);
    EXPECT_EQ(gap_nan, tokens * (y_head - out));  // Nothing written between heads.
  }
}

}  // namespace
}  // namespace cleave::cuda
