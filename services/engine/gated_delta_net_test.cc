#include "services/engine/gated_delta_net.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <vector>

namespace cleave::engine {
namespace {

// Awkward sizes: three value heads per key head, key and value heads of different widths, a
// convolution of three taps, a hidden size no SIMD width divides.
constexpr int64_t kHidden = 19, kKeyHeads = 2, kValueHeads = 6, kDk = 5, kDv = 7, kTaps = 3;
constexpr int64_t kRatio = kValueHeads / kKeyHeads;
constexpr int64_t kKd = kKeyHeads * kDk, kVd = kValueHeads * kDv, kChannels = 2 * kKd + kVd;

// One layer's weights as the checkpoint holds them (value heads grouped by key head).
struct Checkpoint {
  std::vector<float> qkv, z, b, a, conv, a_log, dt_bias, norm, out;
};

Checkpoint randomCheckpoint(std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto fill = [&](int64_t count, float scale, float offset = 0.0f) {
    std::vector<float> v(count);
    for (float& x : v) x = offset + scale * n(rng);
    return v;
  };
  const float in = 1.0f / std::sqrt(static_cast<float>(kHidden));
  return {.qkv = fill(kChannels * kHidden, in),
          .z = fill(kVd * kHidden, in),
          .b = fill(kValueHeads * kHidden, in),
          .a = fill(kValueHeads * kHidden, in),
          .conv = fill(kChannels * kTaps, 0.5f),
          .a_log = fill(kValueHeads, 0.5f, 1.0f),
          .dt_bias = fill(kValueHeads, 0.5f),
          .norm = fill(kDv, 0.1f, 1.0f),
          .out = fill(kHidden * kVd, 1.0f / std::sqrt(static_cast<float>(kVd)))};
}

// The layer in float64, token by token, as transformers' Qwen3.5 computes it; `history` and
// `state` carry the sequence from call to call.
struct Reference {
  std::vector<double> history = std::vector<double>((kTaps - 1) * kChannels, 0.0);
  std::vector<double> state = std::vector<double>(kValueHeads * kDk * kDv, 0.0);

  std::vector<double> token(const Checkpoint& w, const float* x) {
    auto product = [&](const std::vector<float>& m, int64_t rows) {
      std::vector<double> y(rows, 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < kHidden; ++c) y[r] += double(m[r * kHidden + c]) * x[c];
      return y;
    };
    const std::vector<double> mixed = product(w.qkv, kChannels), z = product(w.z, kVd),
                              b = product(w.b, kValueHeads), a = product(w.a, kValueHeads);
    std::vector<double> conv(kChannels);
    for (int64_t ch = 0; ch < kChannels; ++ch) {
      double sum = w.conv[ch * kTaps + kTaps - 1] * mixed[ch];
      for (int64_t j = 0; j < kTaps - 1; ++j)
        sum += w.conv[ch * kTaps + j] * history[j * kChannels + ch];
      conv[ch] = sum / (1.0 + std::exp(-sum));
    }
    for (int64_t j = 0; j + 1 < kTaps - 1; ++j)
      for (int64_t ch = 0; ch < kChannels; ++ch)
        history[j * kChannels + ch] = history[(j + 1) * kChannels + ch];
    for (int64_t ch = 0; ch < kChannels; ++ch) history[(kTaps - 2) * kChannels + ch] = mixed[ch];
    auto l2 = [](std::vector<double> v) {
      double s = 1e-6;
      for (double x : v) s += x * x;
      for (double& x : v) x /= std::sqrt(s);
      return v;
    };
    std::vector<double> o(kVd);
    for (int64_t h = 0; h < kValueHeads; ++h) {
      const int64_t g = h / kRatio;
      std::vector<double> q = l2({conv.begin() + g * kDk, conv.begin() + (g + 1) * kDk});
      const std::vector<double> k =
          l2({conv.begin() + kKd + g * kDk, conv.begin() + kKd + (g + 1) * kDk});
      for (double& x : q) x /= std::sqrt(double(kDk));
      const double beta = 1.0 / (1.0 + std::exp(-b[h]));
      const double decay =
          std::exp(-std::exp(double(w.a_log[h])) * std::log1p(std::exp(a[h] + w.dt_bias[h])));
      double* s = state.data() + h * kDk * kDv;
      for (int64_t i = 0; i < kDk * kDv; ++i) s[i] *= decay;
      for (int64_t j = 0; j < kDv; ++j) {
        double kv = 0;
        for (int64_t i = 0; i < kDk; ++i) kv += s[i * kDv + j] * k[i];
        const double delta = beta * (conv[2 * kKd + h * kDv + j] - kv);
        for (int64_t i = 0; i < kDk; ++i) s[i * kDv + j] += k[i] * delta;
      }
      double squares = 0;
      for (int64_t j = 0; j < kDv; ++j) {
        double sum = 0;
        for (int64_t i = 0; i < kDk; ++i) sum += s[i * kDv + j] * q[i];
        o[h * kDv + j] = sum;
        squares += sum * sum;
      }
      const double inverse = 1.0 / std::sqrt(squares / kDv + 1e-6);
      for (int64_t j = 0; j < kDv; ++j) {
        const double gate = z[h * kDv + j];
        o[h * kDv + j] *= inverse * w.norm[j] * gate / (1.0 + std::exp(-gate));
      }
    }
    std::vector<double> y(kHidden, 0.0);
    for (int64_t r = 0; r < kHidden; ++r)
      for (int64_t c = 0; c < kVd; ++c) y[r] += double(w.out[r * kVd + c]) * o[c];
    return y;
  }
};

// Value head h (grouped) as llama.cpp's files place it (tiled): head j of key head g goes to
// j * key heads + g.
int64_t tiled(int64_t h) { return (h % kRatio) * kKeyHeads + h / kRatio; }

// How the kernel gets the projections: one matrix per kind (Qwen3.5's checkpoints), the same
// with the value heads tiled (llama.cpp's Qwen3.5 files: each row, channel and column of a
// value head moved together), or each key head's rows together (Qwen3-Next's in_proj_qkvz
// and in_proj_ba).
enum class Layout { kSeparate, kTiled, kGrouped };

// Rows `runs` ({first, count} each) of the [rows, kHidden] matrix `m`, end to end.
cpu::CpuMatrix gathered(const std::vector<float>& m,
                        const std::vector<std::pair<int64_t, int64_t>>& runs,
                        std::vector<std::shared_ptr<std::vector<float>>>& keep) {
  auto out = std::make_shared<std::vector<float>>();
  for (const auto& [first, count] : runs)
    out->insert(out->end(), m.begin() + first * kHidden, m.begin() + (first + count) * kHidden);
  keep.push_back(out);
  return *cpu::CpuMatrix::create({.type = model::TensorType::kF32,
                                  .rows = static_cast<int64_t>(out->size()) / kHidden,
                                  .cols = kHidden,
                                  .data = reinterpret_cast<const uint8_t*>(out->data())});
}

// The kernel's weights from the checkpoint's, in `layout`.
GatedDeltaNetWeights kernelWeights(const Checkpoint& c, Layout layout,
                                   std::vector<std::shared_ptr<std::vector<float>>>& keep) {
  const bool tile = layout == Layout::kTiled;
  auto place = [&](int64_t h) { return tile ? tiled(h) : h; };
  auto rowsOf = [&](const std::vector<float>& m, int64_t first, int64_t rows, int64_t head_rows) {
    auto out = std::make_shared<std::vector<float>>(rows * kHidden);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t to = head_rows ? place(r / head_rows) * head_rows + r % head_rows : r;
      std::copy_n(m.data() + (first + r) * kHidden, kHidden, out->data() + to * kHidden);
    }
    keep.push_back(out);
    return *cpu::CpuMatrix::create({.type = model::TensorType::kF32,
                                    .rows = rows,
                                    .cols = kHidden,
                                    .data = reinterpret_cast<const uint8_t*>(out->data())});
  };
  GatedDeltaNetWeights w;
  w.q = rowsOf(c.qkv, 0, kKd, 0);
  w.k = rowsOf(c.qkv, kKd, kKd, 0);
  w.v = rowsOf(c.qkv, 2 * kKd, kVd, kDv);
  w.z = rowsOf(c.z, 0, kVd, kDv);
  w.b = rowsOf(c.b, 0, kValueHeads, 1);
  w.a = rowsOf(c.a, 0, kValueHeads, 1);
  if (layout == Layout::kGrouped) {
    // Per key head g: its q, k, its value heads' v and z rows; then its b rows and a rows.
    std::vector<float> qkvz(c.qkv);
    qkvz.insert(qkvz.end(), c.z.begin(), c.z.end());  // z's rows after qkv's: row kChannels + .
    std::vector<float> ba(c.b);
    ba.insert(ba.end(), c.a.begin(), c.a.end());
    std::vector<std::pair<int64_t, int64_t>> qkvz_runs, ba_runs;
    for (int64_t g = 0; g < kKeyHeads; ++g) {
      const int64_t values = kRatio * kDv;
      qkvz_runs.insert(qkvz_runs.end(), {{g * kDk, kDk},
                                         {kKd + g * kDk, kDk},
                                         {2 * kKd + g * values, values},
                                         {kChannels + g * values, values}});
      ba_runs.insert(ba_runs.end(), {{g * kRatio, kRatio}, {kValueHeads + g * kRatio, kRatio}});
    }
    w = GatedDeltaNetWeights{};
    w.qkvz = gathered(qkvz, qkvz_runs, keep);
    w.ba = gathered(ba, ba_runs, keep);
  }
  w.conv = c.conv;
  w.a_rate.resize(kValueHeads);
  w.dt_bias.resize(kValueHeads);
  for (int64_t h = 0; h < kValueHeads; ++h) {
    w.a_rate[place(h)] = -std::exp(c.a_log[h]);
    w.dt_bias[place(h)] = c.dt_bias[h];
    for (int64_t e = 0; e < kDv; ++e) {
      std::copy_n(c.conv.data() + (2 * kKd + h * kDv + e) * kTaps, kTaps,
                  w.conv.data() + (2 * kKd + place(h) * kDv + e) * kTaps);
    }
  }
  w.norm = c.norm;
  auto out = std::make_shared<std::vector<float>>(kHidden * kVd);
  for (int64_t r = 0; r < kHidden; ++r)
    for (int64_t h = 0; h < kValueHeads; ++h)
      std::copy_n(c.out.data() + r * kVd + h * kDv, kDv, out->data() + r * kVd + place(h) * kDv);
  keep.push_back(out);
  w.out = *cpu::CpuMatrix::create({.type = model::TensorType::kF32,
                                   .rows = kHidden,
                                   .cols = kVd,
                                   .data = reinterpret_cast<const uint8_t*>(out->data())});
  return w;
}

// Two sequences through the kernel in chunks (5 and 1 tokens, then 1 and 3, then 2 and 2), the
// second in a slot left dirty by an earlier sequence, against the float64 reference token by
// token, with the projections in each Layout. Outputs start poisoned.
TEST(GatedDeltaNetTest, ChunkedSequencesMatchAFloat64Reference) {
  std::mt19937 rng(11);
  const Checkpoint checkpoint = randomCheckpoint(rng);
  for (const Layout layout : {Layout::kSeparate, Layout::kTiled, Layout::kGrouped}) {
    const bool tile = layout == Layout::kTiled;
    const char* name = tile                         ? "tiled"
                       : layout == Layout::kGrouped ? "grouped projections"
                                                    : "separate";
    SCOPED_TRACE(name);
    model::ModelConfig config;
    config.hidden_size = kHidden;
    config.rms_norm_eps = 1e-6;
    config.linear_attention = model::LinearAttentionConfig{.key_heads = kKeyHeads,
                                                           .value_heads = kValueHeads,
                                                           .key_head_dim = kDk,
                                                           .value_head_dim = kDv,
                                                           .conv_kernel = kTaps,
                                                           .tiled_value_heads = tile};
    ShardDims dims;
    dims.linear_key_heads = {.begin = 0, .size = kKeyHeads};
    dims.linear_value_heads = {.begin = 0, .size = kValueHeads};
    std::vector<std::shared_ptr<std::vector<float>>> keep;
    const GatedDeltaNetWeights w = kernelWeights(checkpoint, layout, keep);
    cpu::ThreadPool pool(2);
    GatedDeltaNet layer(config, dims, pool);
    const int64_t floats = gatedDeltaNetStateFloats(*config.linear_attention, dims);
    std::vector<float> states(2 * floats, 3.0f);  // The second slot's leftovers.
    Reference reference[2];
    std::mt19937 inputs(12);  // The same tokens for both orders.
    std::normal_distribution<float> n(0.0f, 1.0f);
    double worst = 0;
    const std::pair<int64_t, int64_t> chunks[] = {{5, 1}, {1, 3}, {2, 2}};
    for (const auto& [first, second] : chunks) {
      const bool fresh = &first == &chunks[0].first;
      std::vector<float> x((first + second) * kHidden);
      for (float& v : x) v = n(inputs);
      std::vector<float> out(x.size(), std::numeric_limits<float>::quiet_NaN());
      const LinearStateRun runs[] = {
          {.tokens = first, .reset = fresh, .state = states.data()},
          {.tokens = second, .reset = fresh, .state = states.data() + floats}};
      layer.forward(w, x.data(), runs, out.data());
      for (int64_t t = 0; t < first + second; ++t) {
        const std::vector<double> want =
            reference[t < first ? 0 : 1].token(checkpoint, x.data() + t * kHidden);
        double peak = 0, err = 0;
        for (int64_t i = 0; i < kHidden; ++i) {
          peak = std::max(peak, std::fabs(want[i]));
          err = std::max(err, std::fabs(out[t * kHidden + i] - want[i]));
        }
        ASSERT_FALSE(std::isnan(err)) << "row " << t;
        worst = std::max(worst, err / peak);
      }
    }
    std::printf("%s: max relative error %.2e\n", name, worst);
    EXPECT_LT(worst, 1e-5);
  }
}

}  // namespace
}  // namespace cleave::engine
