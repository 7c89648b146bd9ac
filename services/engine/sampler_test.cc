#include "services/engine/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

namespace cleave::engine {
namespace {

using ::testing::HasSubstr;

std::vector<float> randomLogits(size_t vocab, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> l(vocab);
  for (float& v : l) v = normal(rng);
  return l;
}

std::vector<double> softmax(const std::vector<float>& l, double temperature) {
  double peak = *std::max_element(l.begin(), l.end()), total = 0;
  std::vector<double> p(l.size());
  for (size_t i = 0; i < l.size(); ++i) total += p[i] = std::exp((l[i] - peak) / temperature);
  for (double& x : p) x /= total;
  return p;
}

TEST(SamplerTest, GreedyIsTheArgmaxAndReportsLogprobs) {
  std::mt19937 rng(1);
  std::vector<float> l = randomLogits(1000, rng);
  Sampler sampler({.temperature = 0.0f, .logprobs = 3}, {});
  SampledToken t = sampler.sample(l);
  size_t best = std::max_element(l.begin(), l.end()) - l.begin();
  EXPECT_EQ(t.token, best);
  std::vector<double> p = softmax(l, 1.0);
  EXPECT_NEAR(t.logprob, std::log(p[best]), 1e-5);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].first, best);
  EXPECT_GE(t.top[0].second, t.top[1].second);
  EXPECT_GE(t.top[1].second, t.top[2].second);
  EXPECT_NEAR(t.top[2].second, std::log(p[t.top[2].first]), 1e-5);
}

TEST(SamplerTest, SameSeedSameDrawsAndDifferentSeedsDiffer) {
  std::mt19937 rng(2);
  std::vector<float> l = randomLogits(50, rng);
  auto draws = [&](uint64_t seed) {
    Sampler s({.temperature = 1.0f, .seed = seed}, {});
    std::vector<uint32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(l).token);
    return out;
  };
  EXPECT_EQ(draws(7), draws(7));
  EXPECT_NE(draws(7), draws(8));
}

// Draw frequencies follow softmax(l / T) restricted to what the filters keep: each
// frequency within 5 standard errors of its probability over 40000 draws.
void expectDistribution(const SamplingParams& params, const std::vector<float>& l,
                        std::vector<double> want) {
  Sampler sampler(params, {});
  const int draws = 40000;
  std::vector<int> counts(l.size());
  for (int i = 0; i < draws; ++i) ++counts[sampler.sample(l).token];
  for (size_t i = 0; i < l.size(); ++i) {
    double se = std::sqrt(want[i] * (1 - want[i]) / draws) + 1e-9;
    EXPECT_NEAR(double(counts[i]) / draws, want[i], 5 * se + 1e-4) << "token " << i;
  }
}

TEST(SamplerTest, TemperatureTopKTopPAndMinPShapeTheDistribution) {
  const std::vector<float> l = {2.0f, 1.5f, 1.0f, 0.0f, -1.0f, -3.0f};
  std::vector<double> p = softmax(l, 0.7);
  expectDistribution({.temperature = 0.7f, .seed = 1}, l, p);
  // top_k = 3: renormalized over the three best.
  std::vector<double> k3 = {p[0], p[1], p[2], 0, 0, 0};
  double s3 = k3[0] + k3[1] + k3[2];
  for (double& x : k3) x /= s3;
  expectDistribution({.temperature = 0.7f, .top_k = 3, .seed = 2}, l, k3);
  // top_p: the smallest prefix whose mass reaches it.
  double target = p[0] + p[1] - 1e-3;
  std::vector<double> p2 = {p[0] / (p[0] + p[1]), p[1] / (p[0] + p[1]), 0, 0, 0, 0};
  expectDistribution({.temperature = 0.7f, .top_p = static_cast<float>(target), .seed = 3}, l, p2);
  // min_p: drop tokens under min_p x the top probability.
  double threshold = 0.2 * p[0];
  std::vector<double> pm(l.size());
  double sm = 0;
  for (size_t i = 0; i < l.size(); ++i) sm += pm[i] = p[i] >= threshold ? p[i] : 0;
  for (double& x : pm) x /= sm;
  expectDistribution({.temperature = 0.7f, .min_p = 0.2f, .seed = 4}, l, pm);
}

TEST(SamplerTest, PenaltiesFollowTheirDefinitions) {
  // Token 0 leads by a little; penalties on it must hand the argmax to token 1.
  const std::vector<float> l = {3.0f, 2.9f, -1.0f};
  std::vector<uint32_t> prompt = {0, 2};
  Sampler repetition({.repetition_penalty = 1.2f}, prompt);
  EXPECT_EQ(repetition.sample(l).token, 1u);  // 3.0 / 1.2 = 2.5 < 2.9
  Sampler presence({.presence_penalty = 0.5f}, {});
  EXPECT_EQ(presence.sample(l).token, 0u);  // Nothing generated yet.
  EXPECT_EQ(presence.sample(l).token, 1u);  // 3.0 - 0.5 < 2.9
  Sampler frequency({.frequency_penalty = 0.06f}, {});
  EXPECT_EQ(frequency.sample(l).token, 0u);
  EXPECT_EQ(frequency.sample(l).token, 0u);  // 3.0 - 0.06 > 2.9
  EXPECT_EQ(frequency.sample(l).token, 1u);  // 3.0 - 0.12 < 2.9
  // A negative logit is multiplied by the repetition penalty (pushed down, not up).
  const std::vector<float> negative = {-1.0f, -1.1f};
  Sampler pushed({.repetition_penalty = 1.2f}, std::vector<uint32_t>{0});
  EXPECT_EQ(pushed.sample(negative).token, 1u);
}

TEST(SamplerTest, TheBackendDrawsEveryRowButPenalizedLogprobs) {
  Sampler plain({.temperature = 0.7f, .top_k = 5, .top_p = 0.9f, .min_p = 0.05f, .seed = 11},
                std::vector<uint32_t>{3});
  std::optional<DeviceDraw> draw = plain.deviceDraw();
  ASSERT_TRUE(draw.has_value());
  EXPECT_EQ(draw->temperature, 0.7f);
  EXPECT_EQ(draw->top_k, 5);
  EXPECT_EQ(draw->top_p, 0.9f);
  EXPECT_EQ(draw->min_p, 0.05f);
  EXPECT_EQ(draw->seed, 11u);
  EXPECT_EQ(draw->index, 0u);
  EXPECT_TRUE(draw->seen.empty());  // No penalty: nothing to touch.
  // Observed tokens (drawn elsewhere) and sampled ones both advance the draw index.
  plain.observe(4);
  std::mt19937 rng(5);
  plain.sample(randomLogits(10, rng));
  EXPECT_EQ(plain.deviceDraw()->index, 2u);
  // Log-probabilities too, but not of logits the penalties change.
  Sampler logprobs({.logprobs = 3}, {});
  EXPECT_EQ(logprobs.deviceDraw()->logprobs, 3);
  EXPECT_EQ(plain.deviceDraw()->logprobs, -1);
  EXPECT_FALSE(Sampler({.repetition_penalty = 1.1f, .logprobs = 0}, {}).deviceDraw().has_value());

  // Penalties: the seen tokens, each once, with their output counts.
  auto seen = [](Sampler& sampler) {
    std::map<uint32_t, int32_t> out;
    const DeviceDraw d = *sampler.deviceDraw();
    for (const SeenToken& t : d.seen) EXPECT_TRUE(out.emplace(t.token, t.count).second);
    return out;
  };
  const std::vector<uint32_t> prompt = {5, 6, 5};
  Sampler repetition({.repetition_penalty = 1.2f, .presence_penalty = 0.5f}, prompt);
  for (uint32_t t : {6u, 9u, 9u}) repetition.observe(t);
  EXPECT_EQ(seen(repetition), (std::map<uint32_t, int32_t>{{5, 0}, {6, 1}, {9, 2}}));
  EXPECT_EQ(repetition.deviceDraw()->repetition_penalty, 1.2f);
  EXPECT_EQ(repetition.deviceDraw()->presence_penalty, 0.5f);
  Sampler frequency({.frequency_penalty = -0.5f}, prompt);  // The prompt does not count.
  for (uint32_t t : {6u, 7u, 7u}) frequency.observe(t);
  EXPECT_EQ(seen(frequency), (std::map<uint32_t, int32_t>{{6, 1}, {7, 2}}));
  EXPECT_EQ(frequency.deviceDraw()->frequency_penalty, -0.5f);
}

TEST(SamplerTest, InvalidParametersNameTheField) {
  const std::pair<SamplingParams, const char*> cases[] = {
      {{.temperature = -1}, "temperature"},
      {{.top_k = -2}, "top_k"},
      {{.top_p = 0}, "top_p"},
      {{.top_p = 1.5f}, "top_p"},
      {{.min_p = 2}, "min_p"},
      {{.repetition_penalty = 0}, "repetition_penalty"},
      {{.presence_penalty = 3}, "presence_penalty"},
      {{.frequency_penalty = -3}, "frequency_penalty"},
      {{.logprobs = 21}, "logprobs"},
  };
  for (const auto& [params, field] : cases) {
    absl::Status status = validateSamplingParams(params);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(status.message(), HasSubstr(field));
  }
  EXPECT_TRUE(validateSamplingParams({}).ok());
}

}  // namespace
}  // namespace cleave::engine
