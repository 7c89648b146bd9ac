// The Gated DeltaNet kernels against a float64 reference of the layer written from its
// definition (transformers' Qwen3.5 torch_recurrent_gated_delta_rule and its causal
// convolution), on fresh random inputs: awkward head sizes (each split of a column's rows:
// d_k of 5, 40 and 128), several value heads per key head, sequences of 1 to 19 rows in one
// step, some starting afresh from a slot poisoned with NaN, others continuing a state left
// by an earlier chunk, some rows also leaving the state after them in another slot (drafts'
// row states). The outputs are poisoned before each run; the states written back are
// compared too.
#include "kernels/cuda/gated_delta_net.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cuda/cuda_test_util.h"

namespace cleave::cuda {
namespace {

using testing::bf16;
using testing::DeviceBuffer;

struct Shape {
  int key_heads, value_heads, dk, dv, taps;
  int ratio() const { return value_heads / key_heads; }
  int kd() const { return key_heads * dk; }
  int vd() const { return value_heads * dv; }
  int channels() const { return 2 * kd() + vd(); }
  int projDim() const { return channels() + vd() + 2 * value_heads; }
  int groupChannels() const { return 2 * dk + ratio() * dv; }
  int64_t groupFloats() const { return gatedDeltaNetGroupFloats(dk, dv, taps, ratio()); }
  int64_t layerFloats() const { return key_heads * groupFloats(); }
};

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

struct Weights {
  std::vector<float> conv, a_rate, dt_bias, norm;
};

// One sequence's rows through the layer in float64, from and into its layer state (the
// kernels' layout): out [rows][vd].
void reference(const Shape& s, const Weights& w, const std::vector<float>& proj, int first,
               int rows, bool reset, std::vector<double>& state, std::vector<double>& out) {
  const int channels = s.channels(), gc = s.groupChannels();
  if (reset) std::fill(state.begin(), state.end(), 0.0);
  auto convAt = [&](int ch) -> int64_t {  // where channel ch keeps its inputs
    if (ch < s.kd()) return (ch / s.dk) * s.groupFloats() + ch % s.dk;
    if (ch < 2 * s.kd())
      return ((ch - s.kd()) / s.dk) * s.groupFloats() + s.dk + (ch - s.kd()) % s.dk;
    const int h = (ch - 2 * s.kd()) / s.dv;
    return (h / s.ratio()) * s.groupFloats() + 2 * s.dk + (h % s.ratio()) * s.dv +
           (ch - 2 * s.kd()) % s.dv;
  };
  std::vector<double> mixed(static_cast<size_t>(rows) * channels);
  for (int ch = 0; ch < channels; ++ch) {
    std::vector<double> window(s.taps);
    for (int j = 0; j + 1 < s.taps; ++j) window[j] = state[convAt(ch) + j * gc];
    for (int t = 0; t < rows; ++t) {
      window[s.taps - 1] = proj[(first + t) * int64_t{s.projDim()} + ch];
      double sum = 0;
      for (int j = 0; j < s.taps; ++j) sum += w.conv[ch * s.taps + j] * window[j];
      mixed[t * int64_t{channels} + ch] = sum * sigmoid(sum);
      for (int j = 0; j + 1 < s.taps; ++j) window[j] = window[j + 1];
    }
    for (int j = 0; j + 1 < s.taps; ++j) state[convAt(ch) + j * gc] = window[j];
  }
  out.assign(static_cast<size_t>(rows) * s.vd(), 0.0);
  for (int h = 0; h < s.value_heads; ++h) {
    const int g = h / s.ratio();
    double* S = state.data() + g * s.groupFloats() + (s.taps - 1) * int64_t{gc} +
                (h % s.ratio()) * int64_t{s.dk} * s.dv;
    for (int t = 0; t < rows; ++t) {
      const double* row = mixed.data() + t * int64_t{channels};
      const float* p = proj.data() + (first + t) * int64_t{s.projDim()};
      std::vector<double> q(row + g * s.dk, row + (g + 1) * s.dk);
      std::vector<double> k(row + s.kd() + g * s.dk, row + s.kd() + (g + 1) * s.dk);
      const double* v = row + 2 * s.kd() + h * s.dv;
      double qq = 0, kk = 0;
      for (int i = 0; i < s.dk; ++i) qq += q[i] * q[i], kk += k[i] * k[i];
      for (int i = 0; i < s.dk; ++i) {
        q[i] /= std::sqrt(qq + 1e-6) * std::sqrt(double(s.dk));
        k[i] /= std::sqrt(kk + 1e-6);
      }
      const double beta = sigmoid(p[2 * s.kd() + 2 * s.vd() + h]);
      const double decay = std::exp(
          w.a_rate[h] * softplus(p[2 * s.kd() + 2 * s.vd() + s.value_heads + h] + w.dt_bias[h]));
      std::vector<double> kv(s.dv, 0.0), o(s.dv, 0.0);
      for (int i = 0; i < s.dk; ++i)
        for (int j = 0; j < s.dv; ++j) S[i * s.dv + j] *= decay, kv[j] += S[i * s.dv + j] * k[i];
      for (int j = 0; j < s.dv; ++j) kv[j] = beta * (v[j] - kv[j]);
      for (int i = 0; i < s.dk; ++i)
        for (int j = 0; j < s.dv; ++j)
          S[i * s.dv + j] += k[i] * kv[j], o[j] += S[i * s.dv + j] * q[i];
      double squares = 0;
      for (int j = 0; j < s.dv; ++j) squares += o[j] * o[j];
      const double inverse = 1.0 / std::sqrt(squares / s.dv + 1e-6);
      for (int j = 0; j < s.dv; ++j) {
        const double z = p[2 * s.kd() + s.vd() + h * s.dv + j];
        out[t * int64_t{s.vd()} + h * s.dv + j] = o[j] * inverse * w.norm[j] * z * sigmoid(z);
      }
    }
  }
}

// With `column_groups` > 1 each head's columns are split over blocks (a prefill's form).
void check(const Shape& s, int column_groups = 1) {
  SCOPED_TRACE(::testing::Message()
               << "key heads " << s.key_heads << " value heads " << s.value_heads << " dk " << s.dk
               << " dv " << s.dv << " taps " << s.taps << " column groups " << column_groups);
  ASSERT_TRUE(gatedDeltaNetSupported(s.dk, s.dv, s.taps, s.key_heads, s.value_heads).ok());
  std::mt19937 rng(testing::freshSeed());
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  Weights w;
  for (int i = 0; i < s.channels() * s.taps; ++i) w.conv.push_back(0.6f * unit(rng));
  for (int h = 0; h < s.value_heads; ++h) {
    w.a_rate.push_back(-std::exp(0.5f * unit(rng)));
    w.dt_bias.push_back(0.5f * unit(rng));
  }
  for (int j = 0; j < s.dv; ++j) w.norm.push_back(1.0f + 0.2f * unit(rng));
  // Four sequences in one step, in slots 3, 0, 5, 2 of six (two layers a slot: this one
  // second). Sequences 0 and 2 start afresh (position 0) from a NaN slot; 1 and 3 continue.
  const std::vector<int> rows = {1, 7, 19, 4};
  const std::vector<int> slots = {3, 0, 5, 2};
  const std::vector<bool> fresh = {true, false, true, false};
  const int64_t layer_floats = s.layerFloats(), slot_floats = 2 * layer_floats;
  // Drafts' row states: sequence 2 (in slot 5) keeps the state after its rows 0, 5 and 17
  // in slots 6, 1 and 8; sequence 1 after its row 2 in slot 9 (the last row's is the
  // sequence's own). Slots 4 and 7 nobody names.
  const std::vector<std::vector<std::pair<int, int>>> row_keeps = {
      {}, {{2, 9}}, {{0, 6}, {5, 1}, {17, 8}}, {}};
  std::vector<float> states(10 * slot_floats, std::nanf(""));
  std::vector<std::vector<double>> want_state(rows.size(), std::vector<double>(layer_floats));
  for (size_t q = 0; q < rows.size(); ++q) {
    if (fresh[q]) continue;
    for (int64_t i = 0; i < layer_floats; ++i) {
      const float v = 0.5f * unit(rng);
      states[slots[q] * slot_floats + layer_floats + i] = v;
      want_state[q][i] = v;
    }
  }
  const std::vector<std::vector<double>> initial_state = want_state;
  std::vector<int32_t> q_starts = {0}, positions;
  for (size_t q = 0; q < rows.size(); ++q) {
    q_starts.push_back(q_starts.back() + rows[q]);
    for (int t = 0; t < rows[q]; ++t) positions.push_back((fresh[q] ? 0 : 9) + t);
  }
  const int tokens = q_starts.back();
  std::vector<int32_t> row_slots(tokens, -1);
  for (size_t q = 0; q < rows.size(); ++q)
    for (const auto& [row, slot] : row_keeps[q]) row_slots[q_starts[q] + row] = slot;
  std::vector<bf16> proj = testing::randomBf16(static_cast<size_t>(tokens) * s.projDim(), rng);
  const std::vector<float> proj_f = testing::toFloat(proj);

  DeviceBuffer<bf16> d_proj(proj);
  DeviceBuffer<float> mixed(static_cast<size_t>(tokens) * s.channels());
  DeviceBuffer<int32_t> d_starts(q_starts), d_positions(positions), d_slots(slots),
      d_row_slots(row_slots);
  DeviceBuffer<float> d_states(states), d_conv(w.conv), d_a_rate(w.a_rate), d_dt_bias(w.dt_bias),
      d_norm(w.norm);
  DeviceBuffer<bf16> out(static_cast<size_t>(tokens) * s.vd() + 3);  // poisoned (NaN)
  DeviceBuffer<float> raw(static_cast<size_t>(tokens) * s.vd());
  ASSERT_TRUE(gatedDeltaNet({.proj = d_proj.get(),
                             .proj_stride = s.projDim(),
                             .mixed = mixed.get(),
                             .q_starts = d_starts.get(),
                             .positions = d_positions.get(),
                             .state_slots = d_slots.get(),
                             .row_slots = d_row_slots.get(),
                             .states = d_states.get(),
                             .slot_floats = slot_floats,
                             .layer_offset = layer_floats,
                             .conv = d_conv.get(),
                             .a_rate = d_a_rate.get(),
                             .dt_bias = d_dt_bias.get(),
                             .norm = d_norm.get(),
                             .sequences = static_cast<int>(rows.size()),
                             .key_heads = s.key_heads,
                             .value_heads = s.value_heads,
                             .key_head_dim = s.dk,
                             .value_head_dim = s.dv,
                             .conv_kernel = s.taps,
                             .eps = 1e-6f,
                             .out = out.get(),
                             .out_stride = s.vd(),
                             .column_groups = column_groups,
                             .raw = raw.get(),
                             .tokens = tokens},
                            nullptr)
                  .ok());
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<float> got = testing::toFloat(out.copyToHost());
  const std::vector<float> got_states = d_states.copyToHost();
  for (size_t q = 0; q < rows.size(); ++q) {
    SCOPED_TRACE(::testing::Message() << "sequence " << q << " (" << rows[q] << " rows)");
    std::vector<double> want;
    reference(s, w, proj_f, q_starts[q], rows[q], fresh[q], want_state[q], want);
    const std::vector<float> got_rows(got.begin() + q_starts[q] * int64_t{s.vd()},
                                      got.begin() + q_starts[q + 1] * int64_t{s.vd()});
    const testing::Difference out_diff =
        testing::compare(got_rows, std::vector<float>(want.begin(), want.end()));
    EXPECT_EQ(out_diff.non_finite, 0);
    EXPECT_LE(out_diff.relative_l2, 1e-2);  // bf16 outputs
    const float* slot = got_states.data() + slots[q] * slot_floats;
    const testing::Difference state_diff =
        testing::compare(std::vector<float>(slot + layer_floats, slot + 2 * layer_floats),
                         std::vector<float>(want_state[q].begin(), want_state[q].end()));
    EXPECT_EQ(state_diff.non_finite, 0);
    EXPECT_LE(state_diff.relative_l2, 1e-4);  // f32 state from the same bf16 inputs
    // The slot's other layer is untouched.
    for (int64_t i = 0; i < layer_floats; ++i) ASSERT_TRUE(std::isnan(slot[i])) << i;
    // Each row state is the state after that row, as if the step had ended there.
    for (const auto& [row, kept] : row_keeps[q]) {
      SCOPED_TRACE(::testing::Message() << "state after row " << row << " in slot " << kept);
      std::vector<double> after = initial_state[q], ignored;
      reference(s, w, proj_f, q_starts[q], row + 1, fresh[q], after, ignored);
      const float* at = got_states.data() + kept * slot_floats;
      const testing::Difference row_diff =
          testing::compare(std::vector<float>(at + layer_floats, at + 2 * layer_floats),
                           std::vector<float>(after.begin(), after.end()));
      EXPECT_EQ(row_diff.non_finite, 0);
      EXPECT_LE(row_diff.relative_l2, 1e-4);
      for (int64_t i = 0; i < layer_floats; ++i) ASSERT_TRUE(std::isnan(at[i])) << i;
    }
  }
  // Nor in a slot no sequence or row names.
  for (const int unnamed : {4, 7}) {
    for (int64_t i = 0; i < slot_floats; ++i)
      ASSERT_TRUE(std::isnan(got_states[unnamed * slot_floats + i])) << unnamed << " " << i;
  }
  // Past the last row nothing is written.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(got[tokens * int64_t{s.vd()} + i]));
}

// Each shape with a block a head, then with the column groups a prefill takes.
void checkBothForms(const Shape& s) {
  check(s);
  const int groups = gatedDeltaNetColumnGroups(s.dk, s.dv);
  if (groups > 1) check(s, groups);
}

TEST(GatedDeltaNetKernelTest, SmallHeadsOneThreadPerColumn) {
  CLEAVE_REQUIRE_GPU();
  check({.key_heads = 2, .value_heads = 6, .dk = 5, .dv = 7, .taps = 3});  // 7: no groups
  checkBothForms({.key_heads = 2, .value_heads = 6, .dk = 5, .dv = 12, .taps = 3});
}

TEST(GatedDeltaNetKernelTest, ColumnsSplitInTwo) {
  CLEAVE_REQUIRE_GPU();
  checkBothForms({.key_heads = 1, .value_heads = 2, .dk = 40, .dv = 24, .taps = 4});
}

TEST(GatedDeltaNetKernelTest, Qwen35Heads) {
  CLEAVE_REQUIRE_GPU();
  checkBothForms({.key_heads = 2, .value_heads = 4, .dk = 128, .dv = 128, .taps = 4});
}

TEST(GatedDeltaNetKernelTest, RefusesShapesTheKernelsDoNotTake) {
  EXPECT_FALSE(gatedDeltaNetSupported(256, 128, 4, 1, 1).ok());
  EXPECT_FALSE(gatedDeltaNetSupported(128, 256, 4, 1, 1).ok());  // 1024 threads
  EXPECT_FALSE(gatedDeltaNetSupported(128, 128, 7, 1, 1).ok());
  EXPECT_FALSE(gatedDeltaNetSupported(128, 128, 4, 2, 3).ok());
  EXPECT_TRUE(gatedDeltaNetSupported(32, 256, 2, 4, 8).ok());
  // Column groups: the most of 4, 2 that divide d_v within 256 threads a block.
  EXPECT_EQ(gatedDeltaNetColumnGroups(128, 128), 4);
  EXPECT_EQ(gatedDeltaNetColumnGroups(128, 6), 2);
  EXPECT_EQ(gatedDeltaNetColumnGroups(5, 7), 1);
  EXPECT_EQ(gatedDeltaNetColumnGroups(32, 256), 4);
  // Column groups that do not divide d_v, or without their scratch, are refused before
  // anything runs.
  float raw = 0;
  const GatedDeltaNetArgs good{.sequences = 1,
                               .key_heads = 1,
                               .value_heads = 1,
                               .key_head_dim = 128,
                               .value_head_dim = 128,
                               .conv_kernel = 4,
                               .column_groups = 4,
                               .raw = &raw,
                               .tokens = 1};
  GatedDeltaNetArgs bad = good;
  bad.column_groups = 3;
  EXPECT_EQ(gatedDeltaNet(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bad.column_groups = 0;
  EXPECT_EQ(gatedDeltaNet(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.raw = nullptr;
  EXPECT_EQ(gatedDeltaNet(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave::cuda
