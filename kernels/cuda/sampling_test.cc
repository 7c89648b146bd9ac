// The GPU sampler: greedy equals argmax; draws follow softmax(logits / temperature)
// restricted by top_k, top_p and min_p (frequencies over many draws against the
// probabilities computed here in double, within 5 sigma); nothing outside the kept set is
// ever drawn on a full-size vocabulary; the same (seed, index) gives the same token; the
// penalties change exactly the seen tokens, as their definition does; log-probabilities
// match double sums.
#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cuda/cuda_test_util.h"

namespace cleave::cuda {
namespace {

using testing::DeviceBuffer;

// The kept set and its probabilities, by the sampler's rules, in double.
std::vector<double> keptProbabilities(const std::vector<float>& logits, const SamplingRow& p) {
  const size_t n = logits.size();
  std::vector<double> w(n);
  const double top = *std::max_element(logits.begin(), logits.end());
  for (size_t i = 0; i < n; ++i) w[i] = std::exp((logits[i] - top) / p.temperature);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  std::vector<bool> keep(n, true);
  if (p.top_k > 0)
    for (size_t r = p.top_k; r < n; ++r)
      if (logits[order[r]] < logits[order[p.top_k - 1]]) keep[order[r]] = false;
  if (p.top_p < 1) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += keep[i] ? w[i] : 0;
    double running = 0;
    float last = 0;
    bool reached = false;
    for (size_t r = 0; r < n; ++r) {
      const size_t i = order[r];
      if (!keep[i]) continue;
      if (reached && logits[i] < last) keep[i] = false;
      if (!reached) {
        running += w[i];
        last = logits[i];
        reached = running >= p.top_p * total;
      }
    }
  }
  if (p.min_p > 0)
    for (size_t i = 0; i < n; ++i)
      if (w[i] < p.min_p) keep[i] = false;
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += keep[i] ? w[i] : 0;
  std::vector<double> prob(n);
  for (size_t i = 0; i < n; ++i) prob[i] = keep[i] ? w[i] / total : 0;
  return prob;
}

std::vector<int32_t> draw(const std::vector<float>& logits_rows, int64_t vocab,
                          const std::vector<SamplingRow>& rows) {
  DeviceBuffer<float> logits(logits_rows);
  DeviceBuffer<SamplingRow> params(rows);
  DeviceBuffer<int32_t> ids(rows.size());
  EXPECT_TRUE(sampleTokens(logits.get(), vocab, static_cast<int64_t>(rows.size()), vocab,
                           params.get(), ids.get(), nullptr)
                  .ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return ids.copyToHost();
}

TEST(SamplingTest, FrequenciesFollowTheTruncatedDistribution) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  std::normal_distribution<float> dist(0, 1.5f);
  const int64_t vocab = 12;
  std::vector<float> logits(vocab);
  for (float& x : logits) x = dist(rng);
  const int draws = 40000;
  for (SamplingRow p :
       {SamplingRow{.temperature = 0.7f}, SamplingRow{.temperature = 1.3f, .top_k = 3},
        SamplingRow{.temperature = 1.0f, .top_p = 0.6f},
        SamplingRow{.temperature = 1.0f, .top_k = 6, .top_p = 0.8f, .min_p = 0.1f},
        SamplingRow{.temperature = 2.0f, .min_p = 0.3f}}) {
    SCOPED_TRACE(::testing::Message() << "T " << p.temperature << " top_k " << p.top_k << " top_p "
                                      << p.top_p << " min_p " << p.min_p);
    std::vector<float> rows;
    std::vector<SamplingRow> params;
    for (int d = 0; d < draws; ++d) {
      rows.insert(rows.end(), logits.begin(), logits.end());
      SamplingRow q = p;
      q.seed = rng();
      q.index = static_cast<uint64_t>(d);
      params.push_back(q);
    }
    const std::vector<int32_t> ids = draw(rows, vocab, params);
    const std::vector<double> prob = keptProbabilities(logits, p);
    std::vector<int> counts(vocab, 0);
    for (int32_t id : ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, vocab);
      ++counts[id];
    }
    for (int64_t i = 0; i < vocab; ++i) {
      if (prob[i] == 0) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " is outside the kept set";
        continue;
      }
      const double expected = prob[i] * draws;
      const double sigma = std::sqrt(draws * prob[i] * (1 - prob[i]));
      EXPECT_NEAR(counts[i], expected, 5 * sigma + 1) << "token " << i;
    }
  }
}

TEST(SamplingTest, GreedyAndSeededDrawsOnAFullVocabulary) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  std::normal_distribution<float> dist(0, 4);
  const int64_t vocab = 49152 + 5, rows = 16;
  std::vector<float> logits(rows * vocab);
  for (float& x : logits) x = dist(rng);
  std::vector<SamplingRow> params(rows);
  for (int64_t r = 0; r < rows; ++r)
    params[r] = {.temperature = r % 4 == 0 ? 0.0f : 0.9f,
                 .top_k = r % 3 == 0 ? 50 : 0,
                 .top_p = r % 2 == 0 ? 0.9f : 1.0f,
                 .min_p = r % 5 == 0 ? 0.05f : 0.0f,
                 .seed = 1234 + static_cast<uint64_t>(r),
                 .index = 7};
  const std::vector<int32_t> first = draw(logits, vocab, params);
  EXPECT_EQ(draw(logits, vocab, params), first) << "same (seed, index), same tokens";
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> row(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
    if (params[r].temperature == 0) {
      EXPECT_EQ(first[r], std::max_element(row.begin(), row.end()) - row.begin()) << "row " << r;
      continue;
    }
    EXPECT_GT(keptProbabilities(row, params[r])[first[r]], 0) << "row " << r;
  }
  for (SamplingRow& p : params) p.index += 1;
  EXPECT_NE(draw(logits, vocab, params), first) << "the next draw index changes something";
}

// Penalties on four rows of a full-size vocabulary, each with its own settings and seen
// tokens (one outside the vocabulary, skipped), against their definition computed here in
// the same float operations: every logit equal, bit for bit; unseen ones untouched.
TEST(SamplingTest, PenaltiesChangeExactlyTheSeenTokens) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  const int64_t rows = 4, vocab = 49152 + 5, stride = vocab + 3;
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> logits(rows * stride);
  for (float& v : logits) v = dist(rng);
  const PenaltyRow settings[rows] = {{.repetition = 1.3f},
                                     {.presence = 0.7f, .frequency = 0.25f},
                                     {.repetition = 0.8f, .presence = -0.5f, .frequency = 1.5f},
                                     {}};  // no penalty, no seen tokens
  std::vector<PenaltyRow> penalties;
  std::vector<SeenToken> seen;
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab) - 1), count(0, 4);
  for (int64_t r = 0; r < rows; ++r) {
    PenaltyRow p = settings[r];
    p.begin = static_cast<int32_t>(seen.size());
    std::set<int32_t> distinct;
    if (r < 3)
      while (distinct.size() < 300) distinct.insert(token(rng));
    for (int32_t t : distinct) seen.push_back({.token = t, .count = count(rng)});
    if (r == 0) seen.push_back({.token = static_cast<int32_t>(vocab) + 2, .count = 1});
    p.size = static_cast<int32_t>(seen.size()) - p.begin;
    penalties.push_back(p);
  }
  std::vector<float> want = logits;
  for (int64_t r = 0; r < rows; ++r) {
    const PenaltyRow& p = penalties[r];
    for (int32_t i = p.begin; i < p.begin + p.size; ++i) {
      if (seen[i].token >= vocab) continue;
      float& x = want[r * stride + seen[i].token];
      if (p.repetition != 1.0f) x = x > 0.0f ? x / p.repetition : x * p.repetition;
      if (seen[i].count > 0) x -= p.presence + p.frequency * static_cast<float>(seen[i].count);
    }
  }
  DeviceBuffer<float> dlogits(logits);
  DeviceBuffer<PenaltyRow> dpenalties(penalties);
  DeviceBuffer<SeenToken> dseen(seen);
  ASSERT_TRUE(
      applyPenalties(dlogits.get(), stride, rows, vocab, dpenalties.get(), dseen.get(), nullptr)
          .ok());
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<float> got = dlogits.copyToHost();
  int64_t changed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "row " << i / stride << " token " << i % stride;
    changed += got[i] != logits[i];
  }
  EXPECT_GT(changed, 750);  // Rows 0 and 2: 300 each; row 1: those seen in the output.
}

// Log-softmax at the drawn token and at the best tokens, against double sums here: within
// 2e-4 (float sums over 49k terms); the best tokens in order, a tie to the lower token; a
// row asking for none is left alone.
TEST(SamplingTest, LogSoftmaxAtTheDrawnAndTheBestTokens) {
  CLEAVE_REQUIRE_GPU();
  std::mt19937 rng(testing::freshSeed());
  const int64_t rows = 4, vocab = 49152 + 5, max_top = 20;
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> logits(rows * vocab);
  for (float& v : logits) v = dist(rng);
  logits[2 * vocab + 777] = logits[2 * vocab + 555] = 40.0f;  // A tie at the top of row 2.
  const std::vector<int32_t> counts = {0, 3, 20, -1};
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab) - 1);
  const std::vector<int32_t> ids = {token(rng), token(rng), token(rng), token(rng)};
  DeviceBuffer<float> dlogits(logits), dchosen(rows);
  DeviceBuffer<int32_t> dcounts(counts), dids(ids);
  DeviceBuffer<TokenLogprob> dtop(rows * max_top);
  ASSERT_TRUE(logSoftmaxAt(dlogits.get(), vocab, rows, vocab, dcounts.get(), dids.get(),
                           dchosen.get(), dtop.get(), max_top, nullptr)
                  .ok());
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<float> chosen = dchosen.copyToHost();
  const std::vector<TokenLogprob> top = dtop.copyToHost();
  for (int64_t r = 0; r < rows; ++r) {
    SCOPED_TRACE(r);
    const float* row = logits.data() + r * vocab;
    const double peak = *std::max_element(row, row + vocab);
    double total = 0;
    for (int64_t i = 0; i < vocab; ++i) total += std::exp(double(row[i]) - peak);
    auto logprob = [&](int32_t t) { return double(row[t]) - peak - std::log(total); };
    if (counts[r] < 0) {  // Untouched: still the buffers' 0xFF poison (NaN).
      EXPECT_TRUE(std::isnan(chosen[r]));
      continue;
    }
    EXPECT_NEAR(chosen[r], logprob(ids[r]), 2e-4);
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(
        order.begin(), order.begin() + counts[r], order.end(),
        [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (int32_t k = 0; k < counts[r]; ++k) {
      EXPECT_EQ(top[r * max_top + k].token, order[k]) << k;
      EXPECT_NEAR(top[r * max_top + k].logprob, logprob(order[k]), 2e-4) << k;
    }
  }
  EXPECT_EQ(top[2 * max_top].token, 555);
  EXPECT_EQ(top[2 * max_top + 1].token, 777);
}

}  // namespace
}  // namespace cleave::cuda
