// The MoE expert path on the GPU against float64 references on the host: the token
// layout (every pair placed once, experts padded to whole tiles, experts with 0, 1 and 17
// pairs, another rank's expert skipped), the grouped GEMM in each weight format (bf16, FP8
// with 128x128 block scales, NVFP4) with and without the fused SiLU-and-mul, for decode-
// and prefill-size tiles on awkward shapes (K and the output width not multiples of the
// tiles), and a whole MoE block through combine with a shared expert's output added.
// Quantized weights are random codes and scales; the reference dequantizes them with
// model/tensor_type.h (tested against the formats' definitions).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/log.h"
#include "common/model/tensor_type.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/moe_gemm.h"
#include "kernels/cuda/moe_layout.h"
#include "kernels/cuda/quantize_rows.h"

namespace cleave::cuda {
namespace {

using testing::bf16;
using testing::DeviceBuffer;
using testing::toFloat;

// [tokens][k] expert ids: expert 0 unused, expert 1 one pair, expert 2 seventeen, the rest
// random among [3, experts) without repeats in a token; `foreign` pairs get id -1.
std::vector<int32_t> routes(int64_t tokens, int k, int experts, int foreign, std::mt19937& rng) {
  std::vector<int32_t> ids(tokens * k);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> pool;
    for (int e = 3; e < experts; ++e) pool.push_back(e);
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int s = 0; s < k; ++s) ids[t * k + s] = pool[s];
  }
  ids[0] = 1;
  for (int64_t t = 1; t <= 17; ++t) ids[t * k] = 2;
  for (int i = 0; i < foreign; ++i) ids[(18 + i) * k + 1] = -1;
  return ids;
}

struct HostLayout {
  std::vector<int32_t> expert_rows, row_pair, pair_row, tile_expert;
  int32_t tile_count = 0;
};

HostLayout copyLayout(const MoeLayoutPlan& plan, const MoeLayout& d) {
  HostLayout h;
  auto copy = [](std::vector<int32_t>& out, const int32_t* src, size_t n) {
    out.resize(n);
    EXPECT_EQ(cudaMemcpy(out.data(), src, 4 * n, cudaMemcpyDeviceToHost), cudaSuccess);
  };
  copy(h.expert_rows, d.expert_rows, plan.experts + 1);
  copy(h.row_pair, d.row_pair, plan.max_rows);
  copy(h.pair_row, d.pair_row, plan.max_tokens * plan.k);
  copy(h.tile_expert, d.tile_expert, plan.max_tiles);
  EXPECT_EQ(cudaMemcpy(&h.tile_count, d.tile_count, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// A layout on the device for `ids`, checked against its definition.
struct DeviceLayout {
  MoeLayoutPlan plan;
  DeviceBuffer<unsigned char> workspace;
  MoeLayout layout;
  HostLayout host;
  // Planned for max(tokens, 1) tokens (a plan needs one), built for `tokens`.
  DeviceLayout(const std::vector<int32_t>& ids, int64_t tokens, int k, int experts, int tile_rows)
      : plan(*planMoeLayout(std::max<int64_t>(tokens, 1), k, experts, tile_rows)),
        workspace(plan.workspace_bytes),
        layout(carveMoeLayout(plan, workspace.get())) {
    DeviceBuffer<int32_t> dids(ids);
    EXPECT_TRUE(buildMoeLayout(plan, dids.get(), tokens, layout, nullptr).ok());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    host = copyLayout(plan, layout);
  }
};

TEST(MoeLayoutTest, AStepWithoutTokensUsesNoTiles) {
  CLEAVE_REQUIRE_GPU();
  DeviceLayout d({}, 0, 2, 6, 16);
  EXPECT_EQ(d.host.tile_count, 0);
  for (int e = 0; e <= 6; ++e) EXPECT_EQ(d.host.expert_rows[e], 0);
}

TEST(MoeLayoutTest, PlacesEveryPairOnceAndPadsEachExpertToTiles) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  const int64_t tokens = 41;
  const int k = 4, experts = 12;
  for (int tile_rows : {16, 64}) {
    SCOPED_TRACE(tile_rows);
    const std::vector<int32_t> ids = routes(tokens, k, experts, 3, rng);
    DeviceLayout d(ids, tokens, k, experts, tile_rows);
    const HostLayout& h = d.host;
    std::vector<int> count(experts, 0);
    for (int32_t e : ids)
      if (e >= 0) ++count[e];
    EXPECT_EQ(h.expert_rows[0], 0);
    for (int e = 0; e < experts; ++e) {
      const int rows = h.expert_rows[e + 1] - h.expert_rows[e];
      EXPECT_EQ(rows, (count[e] + tile_rows - 1) / tile_rows * tile_rows) << e;
      for (int r = h.expert_rows[e]; r < h.expert_rows[e + 1]; ++r) {
        const int32_t pair = h.row_pair[r];
        if (r - h.expert_rows[e] < count[e]) {
          ASSERT_GE(pair, 0) << r;
          EXPECT_EQ(ids[pair], e);
          EXPECT_EQ(h.pair_row[pair], r);
        } else {
          EXPECT_EQ(pair, -1) << "padding row " << r;
        }
      }
      for (int t = h.expert_rows[e] / tile_rows; t < h.expert_rows[e + 1] / tile_rows; ++t)
        EXPECT_EQ(h.tile_expert[t], e);
    }
    EXPECT_EQ(count[0], 0);
    EXPECT_EQ(h.tile_count, h.expert_rows[experts] / tile_rows);
    EXPECT_LE(h.tile_count, d.plan.max_tiles);
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0) EXPECT_EQ(h.pair_row[i], -1);
  }
}

// Random weights of one format, and their float dequantization [experts][rows][cols].
struct HostWeights {
  ExpertWeightFormat format;
  int experts;
  int64_t rows, cols;
  std::vector<uint8_t> data, group_scales;
  std::vector<float> block_scales, row_scales, dequantized;
};

uint8_t randomE4m3(std::mt19937& rng, int min_exponent, int max_exponent) {
  std::uniform_int_distribution<int> exponent(min_exponent, max_exponent), mantissa(0, 7),
      sign(0, 1);
  return static_cast<uint8_t>((sign(rng) << 7) | (exponent(rng) << 3) | mantissa(rng));
}

HostWeights randomWeights(ExpertWeightFormat format, int experts, int64_t rows, int64_t cols,
                          std::mt19937& rng) {
  HostWeights w;
  w.format = format;
  w.experts = experts;
  w.rows = rows;
  w.cols = cols;
  const int64_t n = int64_t{experts} * rows * cols;
  w.dequantized.resize(n);
  std::uniform_real_distribution<float> unit(0.5f, 1.5f);
  if (format == ExpertWeightFormat::kBf16) {
    const std::vector<bf16> values = testing::randomBf16(n, rng, 1.0f / std::sqrt(float(cols)));
    w.data.resize(2 * n);
    std::memcpy(w.data.data(), values.data(), 2 * n);
    w.dequantized = toFloat(values);
  } else if (format == ExpertWeightFormat::kFp8Block128) {
    w.data.resize(n);
    for (uint8_t& b : w.data) b = randomE4m3(rng, 0, 14);  // finite, subnormals and zeros too
    const int64_t br = (rows + 127) / 128, bc = cols / 128;
    w.block_scales.resize(int64_t{experts} * br * bc);
    for (float& s : w.block_scales) s = unit(rng) / (64.0f * std::sqrt(float(cols)));
    CLEAVE_CHECK_OK(
        model::dequantize(model::TensorType::kF8E4M3, w.data.data(), n, w.dequantized.data()));
    for (int e = 0; e < experts; ++e)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          w.dequantized[(e * rows + r) * cols + c] *=
              w.block_scales[(e * br + r / 128) * bc + c / 128];
  } else {
    w.data.resize(n / 2);
    for (uint8_t& b : w.data) b = static_cast<uint8_t>(rng());
    w.group_scales.resize(n / 16);
    for (uint8_t& b : w.group_scales) b = randomE4m3(rng, 5, 9) & 0x7f;  // positive
    w.row_scales.resize(int64_t{experts} * rows);  // one global per half, as gate and up
    for (int64_t i = 0; i < int64_t{experts} * rows; i += rows / 2) {
      const float global = unit(rng) / (8.0f * std::sqrt(float(cols)));
      std::fill(w.row_scales.begin() + i, w.row_scales.begin() + i + rows / 2, global);
    }
    CLEAVE_CHECK_OK(
        model::dequantize(model::TensorType::kE2M1, w.data.data(), n, w.dequantized.data()));
    std::vector<float> scales(n / 16);
    CLEAVE_CHECK_OK(model::dequantize(model::TensorType::kF8E4M3, w.group_scales.data(), n / 16,
                                      scales.data()));
    for (int64_t i = 0; i < n; ++i) w.dequantized[i] *= scales[i / 16] * w.row_scales[i / cols];
  }
  return w;
}

struct DeviceWeights {
  DeviceBuffer<uint8_t> data, group_scales;
  DeviceBuffer<float> block_scales, row_scales;
  ExpertWeights view;
  explicit DeviceWeights(const HostWeights& w)
      : data(w.data),
        group_scales(w.group_scales),
        block_scales(w.block_scales),
        row_scales(w.row_scales) {
    view = {.format = w.format,
            .experts = w.experts,
            .rows = w.rows,
            .cols = w.cols,
            .data = data.get(),
            .block_scales = w.block_scales.empty() ? nullptr : block_scales.get(),
            .group_scales = w.group_scales.empty() ? nullptr : group_scales.get(),
            .row_scales = w.row_scales.empty() ? nullptr : row_scales.get()};
  }
};

// The activations a native product saw: the codes and scales its scratch holds for `rows`
// rows of K, dequantized on the host ([rows][k]).
std::vector<float> dequantizedRows(ExpertWeightFormat format, void* scratch, int64_t rows,
                                   int64_t k) {
  const bool fp8 = format == ExpertWeightFormat::kFp8Block128;
  const RowQuantization kind = fp8 ? RowQuantization::kFp8Block128 : RowQuantization::kNvfp4;
  const QuantizedRows q = carveQuantizedRows(kind, rows, k, scratch);
  auto download = [](const void* src, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  };
  std::vector<float> out(rows * k);
  const std::vector<uint8_t> codes = download(q.codes, fp8 ? rows * k : rows * k / 2);
  const std::vector<uint8_t> raw_scales = download(q.scales, 4 * (fp8 ? rows * (k / 128) : rows));
  std::vector<float> scales(raw_scales.size() / 4);
  std::memcpy(scales.data(), raw_scales.data(), raw_scales.size());
  CLEAVE_CHECK_OK(model::dequantize(fp8 ? model::TensorType::kF8E4M3 : model::TensorType::kE2M1,
                                    codes.data(), rows * k, out.data()));
  if (fp8) {
    for (int64_t i = 0; i < rows * k; ++i) out[i] *= scales[i / 128];
    return out;
  }
  const std::vector<uint8_t> group_codes = download(q.group_scales, rows * (k / 16));
  std::vector<float> groups(group_codes.size());
  CLEAVE_CHECK_OK(model::dequantize(model::TensorType::kF8E4M3, group_codes.data(),
                                    group_codes.size(), groups.data()));
  for (int64_t i = 0; i < rows * k; ++i) out[i] *= groups[i / 16] * scales[i / k];
  return out;
}

// Whether this device runs the native operands of `format` in `tile_rows`-row tiles.
bool nativeRuns(ExpertWeightFormat format, int tile_rows) {
  if (format == ExpertWeightFormat::kNvfp4) return nativeOperandsPreferred(format);
  auto devices = listDevices();
  return tile_rows == 16 || (devices.ok() && !devices->empty() && (*devices)[0].sm_major >= 12);
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

// What joins a product in the epilogue: a bias per expert and weight row ([experts][rows],
// empty: none) before the activation, and the activation of a fused gate/up.
struct Epilogue {
  std::vector<float> bias;
  GatedActivation activation;
};

// The activation in float64, from its definition (moe_gemm.h).
double activate(double gate, double up, const GatedActivation& a) {
  if (a.limit <= 0) return silu(gate) * up;
  const double g = std::min<double>(gate, a.limit);
  const double u = std::clamp<double>(up, -a.limit, a.limit);
  return (u + 1.0) * g / (1.0 + std::exp(-double(a.alpha) * g));
}

// out[pair][n] of one projection in float64: x rows of the pair's token (or of the pair
// itself), times its expert's dequantized rows, plus the epilogue's bias; the activation of
// gate and up when silu.
std::vector<double> reference(const HostWeights& w, const std::vector<float>& x, int64_t x_stride,
                              const std::vector<int32_t>& ids, int k, bool gather, bool silu_mul,
                              const Epilogue& epilogue = {}) {
  const int64_t out_cols = silu_mul ? w.rows / 2 : w.rows;
  std::vector<double> out(ids.size() * out_cols, 0.0);
  for (size_t pair = 0; pair < ids.size(); ++pair) {
    if (ids[pair] < 0) continue;
    const float* xr = x.data() + (gather ? pair / k : pair) * x_stride;
    auto dot = [&](int64_t row) {
      const float* wr = w.dequantized.data() + (ids[pair] * w.rows + row) * w.cols;
      double sum = epilogue.bias.empty() ? 0.0 : epilogue.bias[ids[pair] * w.rows + row];
      for (int64_t c = 0; c < w.cols; ++c) sum += double(xr[c]) * wr[c];
      return sum;
    };
    for (int64_t n = 0; n < out_cols; ++n)
      out[pair * out_cols + n] =
          silu_mul ? activate(dot(n), dot(out_cols + n), epilogue.activation) : dot(n);
  }
  return out;
}

struct ProjectionCase {
  ExpertWeightFormat format;
  int tile_rows;
  bool silu;
  int64_t rows, cols;
  GemmOperands operands = GemmOperands::kWidened;
  bool gpt_oss = false;  // biased, and (with silu) the clamped SwiGLU
};

// Widened operands against float64 of the dequantized weights and the bf16 activations;
// native ones (W8A8 e4m3, W4A4 E2M1: the activations quantized into scratch first) against
// float64 of the activations the kernel saw, dequantized, so only the product's own error
// remains; that quantization is bounded on its own.
class MoeGemmTest : public ::testing::TestWithParam<ProjectionCase> {};

TEST_P(MoeGemmTest, MatchesAFloat64Reference) {
  CLEAVE_REQUIRE_GPU();
  const ProjectionCase c = GetParam();
  const bool native = c.operands == GemmOperands::kNative;
  if (native && !nativeRuns(c.format, c.tile_rows))
    GTEST_SKIP() << expertWeightFormatName(c.format) << " native operands in " << c.tile_rows
                 << "-row tiles do not run on this device";
  ASSERT_TRUE(prepareMoeGemm().ok());
  std::mt19937 rng(testing::freshSeed());
  const int64_t tokens = 29;
  const int k = 3, experts = 10;
  const std::vector<int32_t> ids = routes(tokens, k, experts, 2, rng);
  DeviceLayout layout(ids, tokens, k, experts, c.tile_rows);
  const HostWeights w = randomWeights(c.format, experts, c.rows, c.cols, rng);
  DeviceWeights dw(w);
  const int64_t x_stride = c.cols + 8;
  std::vector<bf16> x = testing::randomBf16(tokens * x_stride, rng);
  if (native) {
    // Magnitudes 10^[-2, 2] per token and 128 columns, so that each row's and block's own
    // scale matters: one taken from the wrong row or block shows.
    std::uniform_real_distribution<float> exponent(-2.0f, 2.0f);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t b = 0; b * 128 < x_stride; ++b) {
        const float scale = std::pow(10.0f, exponent(rng));
        for (int64_t i = b * 128; i < std::min((b + 1) * 128, x_stride); ++i)
          x[t * x_stride + i] = __float2bfloat16(toFloat(x[t * x_stride + i]) * scale);
      }
    }
  }
  DeviceBuffer<bf16> dx(x);
  const int64_t out_cols = c.silu ? c.rows / 2 : c.rows, y_stride = out_cols + 2;
  DeviceBuffer<bf16> dy(layout.plan.max_rows * y_stride);  // poisoned
  // gpt-oss's epilogue: biases in [-2, 2) and its clamped SwiGLU at a limit of 1.5 (its
  // checkpoints' 7 scaled to these products), so gate and up cross the clamp both ways while
  // the products still weigh in the outputs.
  const std::vector<bf16> bias = testing::randomBf16(experts * c.rows, rng, 2.0f);
  DeviceBuffer<bf16> dbias(bias);
  Epilogue epilogue;
  if (c.gpt_oss) epilogue = {.bias = toFloat(bias), .activation = {.limit = 1.5f, .alpha = 1.702f}};
  const int64_t scratch_bytes = nativeScratchBytes(c.format, tokens, c.cols);
  DeviceBuffer<uint8_t> scratch(std::max<int64_t>(scratch_bytes, 1));
  const absl::Status run = runMoeGemm({.plan = &layout.plan,
                                       .layout = layout.layout,
                                       .x = dx.get(),
                                       .x_stride = x_stride,
                                       .gather = true,
                                       .weights = dw.view,
                                       .bias = c.gpt_oss ? dbias.get() : nullptr,
                                       .silu_mul = c.silu,
                                       .activation = epilogue.activation,
                                       .y = dy.get(),
                                       .y_stride = y_stride,
                                       .operands = c.operands,
                                       .tokens = tokens,
                                       .scratch = scratch.get(),
                                       .scratch_bytes = scratch_bytes},
                                      nullptr);
  ASSERT_TRUE(run.ok()) << run;
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<float> y = toFloat(dy.copyToHost());
  std::vector<float> x_tight(tokens * c.cols);  // the activations, [tokens][K]
  const std::vector<float> xf = toFloat(x);
  for (int64_t t = 0; t < tokens; ++t)
    std::copy_n(xf.begin() + t * x_stride, c.cols, x_tight.begin() + t * c.cols);
  const std::vector<float> seen =
      native ? dequantizedRows(c.format, scratch.get(), tokens, c.cols) : x_tight;
  if (native) {
    const double bound = c.format == ExpertWeightFormat::kFp8Block128 ? 0.05 : 0.15;
    EXPECT_LE(testing::compare(seen, x_tight).relative_l2, bound) << "the quantized activations";
  }
  const std::vector<double> want = reference(w, seen, c.cols, ids, k, true, c.silu, epilogue);
  std::vector<float> got_pairs, want_pairs;
  for (size_t pair = 0; pair < ids.size(); ++pair) {
    const int32_t row = layout.host.pair_row[pair];
    if (row < 0) continue;
    for (int64_t n = 0; n < out_cols; ++n) {
      got_pairs.push_back(y[row * y_stride + n]);
      want_pairs.push_back(static_cast<float>(want[pair * out_cols + n]));
    }
  }
  const testing::Difference d = testing::compare(got_pairs, want_pairs);
  std::printf("%s %s tile %d%s%s [%lld x %lld]: relative L2 %.2e, max abs %.2e\n",
              expertWeightFormatName(c.format), gemmOperandsName(c.operands), c.tile_rows,
              c.silu ? " silu" : "", c.gpt_oss ? " gpt-oss" : "", static_cast<long long>(c.rows),
              static_cast<long long>(c.cols), d.relative_l2, d.max_abs);
  EXPECT_EQ(d.non_finite, 0);
  EXPECT_LE(d.relative_l2, 1e-2);  // bf16 activations and outputs
}

// K not a multiple of 64 (96: a half last stage), widths not multiples of 64 (80, 48), up
// rows starting inside an FP8 128-row block (gate/up of 2 x 160 rows).
INSTANTIATE_TEST_SUITE_P(
    Formats, MoeGemmTest,
    ::testing::Values(ProjectionCase{ExpertWeightFormat::kBf16, 16, false, 80, 96},
                      ProjectionCase{ExpertWeightFormat::kBf16, 64, true, 96, 160},
                      ProjectionCase{ExpertWeightFormat::kBf16, 16, true, 96, 160},
                      ProjectionCase{ExpertWeightFormat::kNvfp4, 16, false, 48, 96},
                      ProjectionCase{ExpertWeightFormat::kNvfp4, 64, true, 160, 224},
                      ProjectionCase{ExpertWeightFormat::kNvfp4, 16, true, 160, 224},
                      ProjectionCase{ExpertWeightFormat::kFp8Block128, 16, false, 80, 256},
                      ProjectionCase{ExpertWeightFormat::kFp8Block128, 16, true, 320, 256},
                      ProjectionCase{ExpertWeightFormat::kFp8Block128, 64, true, 320, 384}));

// gpt-oss's experts: biases on gate, up and down, the clamped SwiGLU.
constexpr GemmOperands kWidened = GemmOperands::kWidened;
INSTANTIATE_TEST_SUITE_P(
    GptOss, MoeGemmTest,
    ::testing::Values(ProjectionCase{ExpertWeightFormat::kBf16, 16, true, 96, 160, kWidened, true},
                      ProjectionCase{ExpertWeightFormat::kBf16, 64, true, 96, 160, kWidened, true},
                      ProjectionCase{ExpertWeightFormat::kBf16, 16, false, 80, 96, kWidened, true},
                      ProjectionCase{ExpertWeightFormat::kNvfp4, 64, true, 160, 224, kWidened,
                                     true},
                      ProjectionCase{ExpertWeightFormat::kNvfp4, 16, true, 160, 192,
                                     GemmOperands::kNative, true}));

// K with a partial last stage (nvfp4 320 = 256 + 64), widths not multiples of 64 (80), up
// rows starting inside an FP8 128-row block (2 x 160).
constexpr GemmOperands kNative = GemmOperands::kNative;
INSTANTIATE_TEST_SUITE_P(
    Native, MoeGemmTest,
    ::testing::Values(ProjectionCase{ExpertWeightFormat::kFp8Block128, 16, false, 80, 384, kNative},
                      ProjectionCase{ExpertWeightFormat::kFp8Block128, 16, true, 320, 256, kNative},
                      ProjectionCase{ExpertWeightFormat::kFp8Block128, 64, true, 320, 384, kNative},
                      ProjectionCase{ExpertWeightFormat::kNvfp4, 16, false, 80, 320, kNative},
                      ProjectionCase{ExpertWeightFormat::kNvfp4, 16, true, 160, 192, kNative},
                      ProjectionCase{ExpertWeightFormat::kNvfp4, 64, true, 160, 320, kNative},
                      // Real hidden sizes: the whole K accumulates in the MMA (E2M1) or in
                      // 128-column blocks (e4m3).
                      ProjectionCase{ExpertWeightFormat::kNvfp4, 16, false, 64, 4096, kNative},
                      ProjectionCase{ExpertWeightFormat::kFp8Block128, 16, false, 64, 4096,
                                     kNative}));

// One matrix, rows in order (the dense skinny path): 1, 5 and 16 rows in one 16-row tile,
// 37 rows in 64-row tiles, each format, plain and fused gate/up.
TEST(SkinnyGemmTest, MatchesAFloat64Reference) {
  CLEAVE_REQUIRE_GPU();
  ASSERT_TRUE(prepareMoeGemm().ok());
  std::mt19937 rng(testing::freshSeed());
  for (ExpertWeightFormat format :
       {ExpertWeightFormat::kBf16, ExpertWeightFormat::kFp8Block128, ExpertWeightFormat::kNvfp4}) {
    for (GemmOperands operands : {GemmOperands::kWidened, GemmOperands::kNative}) {
      for (bool silu : {false, true}) {
        for (int64_t rows : {1, 5, 16, 37}) {
          const bool native = operands == GemmOperands::kNative;
          if (native &&
              (format == ExpertWeightFormat::kBf16 || !nativeRuns(format, rows <= 16 ? 16 : 64)))
            continue;
          SCOPED_TRACE(::testing::Message()
                       << expertWeightFormatName(format) << " " << gemmOperandsName(operands)
                       << " silu " << silu << " rows " << rows);
          const int64_t n = silu ? 320 : 176, k = 256;
          const HostWeights w = randomWeights(format, 1, n, k, rng);
          DeviceWeights dw(w);
          const std::vector<bf16> x = testing::randomBf16(rows * k, rng);
          DeviceBuffer<bf16> dx(x);
          const int64_t out_cols = silu ? n / 2 : n;
          DeviceBuffer<bf16> dy(rows * out_cols);  // poisoned, exactly sized
          // Odd row counts: a bias on every row of the weight (before the activation), in
          // [-1, 1); even ones none.
          const bool biased = rows % 2 == 1;
          const std::vector<bf16> bias = testing::randomBf16(n, rng);
          DeviceBuffer<bf16> dbias(bias);
          const Epilogue epilogue{.bias = biased ? toFloat(bias) : std::vector<float>{}};
          const int64_t scratch_bytes = nativeScratchBytes(format, rows, k);
          DeviceBuffer<uint8_t> scratch(std::max<int64_t>(scratch_bytes, 1));
          const absl::Status run = runSkinnyGemm({.x = dx.get(),
                                                  .x_stride = k,
                                                  .rows = rows,
                                                  .weights = dw.view,
                                                  .silu_mul = silu,
                                                  .y = dy.get(),
                                                  .y_stride = out_cols,
                                                  .bias = biased ? dbias.get() : nullptr,
                                                  .operands = operands,
                                                  .scratch = scratch.get(),
                                                  .scratch_bytes = scratch_bytes},
                                                 nullptr);
          ASSERT_TRUE(run.ok()) << run;
          CUDA_ASSERT_OK(cudaDeviceSynchronize());
          const std::vector<int32_t> ids(rows, 0);
          const std::vector<float> seen =
              native ? dequantizedRows(format, scratch.get(), rows, k) : toFloat(x);
          const std::vector<double> want = reference(w, seen, k, ids, 1, false, silu, epilogue);
          const testing::Difference d = testing::compare(
              toFloat(dy.copyToHost()), std::vector<float>(want.begin(), want.end()));
          EXPECT_EQ(d.non_finite, 0);
          EXPECT_LE(d.relative_l2, 1e-2);
        }
      }
    }
  }
}

// gate/up -> down -> combine with routing weights and a shared expert, against float64
// (the intermediate rounded to bf16 as the GPU keeps it), on widened and native operands
// (there the reference takes the activations each product quantized, and the intermediate
// is checked on its own).
TEST(MoeBlockGpuTest, GateUpDownCombineMatchesTheReference) {
  CLEAVE_REQUIRE_GPU();
  ASSERT_TRUE(prepareMoeGemm().ok());
  std::mt19937 rng(testing::freshSeed());
  const int64_t tokens = 23;
  const int k = 2, experts = 8;
  for (ExpertWeightFormat format :
       {ExpertWeightFormat::kBf16, ExpertWeightFormat::kNvfp4, ExpertWeightFormat::kFp8Block128}) {
    for (GemmOperands operands : {GemmOperands::kWidened, GemmOperands::kNative}) {
      const bool native = operands == GemmOperands::kNative;
      if (native && (format == ExpertWeightFormat::kBf16 || !nativeRuns(format, 16))) continue;
      SCOPED_TRACE(::testing::Message()
                   << expertWeightFormatName(format) << " " << gemmOperandsName(operands));
      // FP8's 128-column blocks need both sizes whole, native E2M1 K % 64; widened NVFP4 takes
      // a hidden size that is not a multiple of the 64-column tiles.
      const bool fp8 = format == ExpertWeightFormat::kFp8Block128;
      const int64_t hidden = fp8 ? 256 : native ? 192 : 96, inter = fp8 || native ? 128 : 64;
      const std::vector<int32_t> ids = routes(tokens, k, experts, 1, rng);
      DeviceLayout layout(ids, tokens, k, experts, 16);
      const HostWeights gate_up = randomWeights(format, experts, 2 * inter, hidden, rng);
      const HostWeights down = randomWeights(format, experts, hidden, inter, rng);
      DeviceWeights dgu(gate_up), ddown(down);
      const std::vector<bf16> x = testing::randomBf16(tokens * hidden, rng);
      const std::vector<bf16> shared = testing::randomBf16(tokens * hidden, rng, 0.1f);
      std::vector<float> weights(tokens * k);
      std::uniform_real_distribution<float> unit(0.1f, 1.0f);
      for (float& v : weights) v = unit(rng);
      const int64_t max_rows = layout.plan.max_rows;
      DeviceBuffer<bf16> dx(x), dshared(shared), dact(max_rows * inter), dy(max_rows * hidden),
          dout(tokens * hidden);
      DeviceBuffer<float> dweights(weights);
      const int64_t gu_bytes = nativeScratchBytes(format, tokens, hidden);
      const int64_t down_bytes = nativeScratchBytes(format, max_rows, inter);
      DeviceBuffer<uint8_t> gu_scratch(std::max<int64_t>(gu_bytes, 1)),
          down_scratch(std::max<int64_t>(down_bytes, 1));
      absl::Status run = runMoeGemm({.plan = &layout.plan,
                                     .layout = layout.layout,
                                     .x = dx.get(),
                                     .x_stride = hidden,
                                     .gather = true,
                                     .weights = dgu.view,
                                     .silu_mul = true,
                                     .y = dact.get(),
                                     .y_stride = inter,
                                     .operands = operands,
                                     .tokens = tokens,
                                     .scratch = gu_scratch.get(),
                                     .scratch_bytes = gu_bytes},
                                    nullptr);
      ASSERT_TRUE(run.ok()) << run;
      run = runMoeGemm({.plan = &layout.plan,
                        .layout = layout.layout,
                        .x = dact.get(),
                        .x_stride = inter,
                        .gather = false,
                        .weights = ddown.view,
                        .y = dy.get(),
                        .y_stride = hidden,
                        .operands = operands,
                        .scratch = down_scratch.get(),
                        .scratch_bytes = down_bytes},
                       nullptr);
      ASSERT_TRUE(run.ok()) << run;
      ASSERT_TRUE(combineExperts({.y = dy.get(),
                                  .y_stride = hidden,
                                  .weights = dweights.get(),
                                  .pair_row = layout.layout.pair_row,
                                  .tokens = tokens,
                                  .k = k,
                                  .hidden = static_cast<int>(hidden),
                                  .shared = dshared.get(),
                                  .shared_stride = hidden,
                                  .out = dout.get(),
                                  .out_stride = hidden},
                                 nullptr)
                      .ok());
      CUDA_ASSERT_OK(cudaDeviceSynchronize());
      // The activation per pair: rounded to bf16 (widened), or as the down product quantized
      // it (native; the intermediate itself checked against what gate/up saw).
      const std::vector<float> x_seen =
          native ? dequantizedRows(format, gu_scratch.get(), tokens, hidden) : toFloat(x);
      const std::vector<double> act = reference(gate_up, x_seen, hidden, ids, k, true, true);
      std::vector<float> act_in(act.size());
      if (native) {
        const std::vector<float> rows =
            dequantizedRows(format, down_scratch.get(), max_rows, inter);
        const std::vector<float> act_gpu = toFloat(dact.copyToHost());
        std::vector<float> got, want;
        for (size_t pair = 0; pair < ids.size(); ++pair) {
          const int32_t row = layout.host.pair_row[pair];
          if (row < 0) continue;
          for (int64_t i = 0; i < inter; ++i) {
            act_in[pair * inter + i] = rows[row * inter + i];
            got.push_back(act_gpu[row * inter + i]);
            want.push_back(static_cast<float>(act[pair * inter + i]));
          }
        }
        const testing::Difference d = testing::compare(got, want);
        EXPECT_EQ(d.non_finite, 0);
        EXPECT_LE(d.relative_l2, 1e-2) << "the gate/up intermediate";
      } else {
        for (size_t i = 0; i < act.size(); ++i)
          act_in[i] = toFloat(__float2bfloat16(static_cast<float>(act[i])));
      }
      const std::vector<double> y = reference(down, act_in, inter, ids, k, false, false);
      std::vector<float> want(tokens * hidden);
      const std::vector<float> shared_f = toFloat(shared);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t h = 0; h < hidden; ++h) {
          double sum = shared_f[t * hidden + h];
          for (int s = 0; s < k; ++s)
            if (ids[t * k + s] >= 0) sum += weights[t * k + s] * y[(t * k + s) * hidden + h];
          want[t * hidden + h] = static_cast<float>(sum);
        }
      }
      const testing::Difference d = testing::compare(toFloat(dout.copyToHost()), want);
      std::printf("moe block %s %s: relative L2 %.2e\n", expertWeightFormatName(format),
                  gemmOperandsName(operands), d.relative_l2);
      EXPECT_EQ(d.non_finite, 0);
      EXPECT_LE(d.relative_l2, 2e-2);
    }
  }
}

TEST(MoeGemmTest, RefusesShapesTheKernelsCannotTake) {
  MoeLayoutPlan plan = *planMoeLayout(4, 2, 4, 16);
  uint8_t dummy = 0;
  MoeGemmArgs args{.plan = &plan,
                   .x = &dummy,
                   .x_stride = 96,
                   .weights = {.format = ExpertWeightFormat::kFp8Block128,
                               .experts = 4,
                               .rows = 64,
                               .cols = 96,
                               .data = &dummy},
                   .y = &dummy,
                   .y_stride = 64};
  absl::Status s = runMoeGemm(args, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("multiple of 128"), std::string::npos) << s;
  args.weights.format = ExpertWeightFormat::kNvfp4;
  s = runMoeGemm(args, nullptr);
  EXPECT_NE(s.message().find("no group or row scales"), std::string::npos) << s;
  // Native operands that cannot run are refused when asked for, not replaced.
  args.weights.format = ExpertWeightFormat::kFp8Block128;
  args.weights.cols = args.x_stride = 128;
  args.weights.block_scales = reinterpret_cast<const float*>(&dummy);
  args.operands = GemmOperands::kNative;
  s = runMoeGemm(args, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("bytes of scratch"), std::string::npos) << s;
  if (!nativeOperandsPreferred(ExpertWeightFormat::kNvfp4)) {
    args.weights.format = ExpertWeightFormat::kNvfp4;
    args.weights.group_scales = &dummy;
    args.weights.row_scales = reinterpret_cast<const float*>(&dummy);
    s = runMoeGemm(args, nullptr);
    EXPECT_NE(s.message().find("sm_120a"), std::string::npos) << s;
  }
  EXPECT_FALSE(planMoeLayout(4, 2, 2000, 16).ok());
  EXPECT_FALSE(planMoeLayout(4, 2, 8, 32).ok());
}

}  // namespace
}  // namespace cleave::cuda
