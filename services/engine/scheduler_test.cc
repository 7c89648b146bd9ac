#include "services/engine/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/cpu/matmul.h"

namespace cleave::engine {
namespace {

using ::testing::HasSubstr;

const std::string kTinyModel = std::string(CLEAVE_GOLDEN_DIR) + "/engine/hf/llama_f32";

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loaded = loadLlama(kTinyModel);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    weights_ = std::move(*loaded);
    auto group = TpGroup::load(kTinyModel, {.tp = 1, .threads = 2});
    ASSERT_TRUE(group.ok()) << group.status();
    group_ = std::move(*group);
  }

  // The model with a fresh pool of `num_blocks` KV blocks of 4 positions.
  TpGroup& withBlocks(int64_t num_blocks) {
    CLEAVE_CHECK_OK(group_->allocateKv(num_blocks, 4));
    return *group_;
  }

  std::vector<uint32_t> randomPrompt(int length) {
    std::vector<uint32_t> p(length);
    for (auto& id : p) id = rng_() % weights_->config.vocab_size;
    return p;
  }

  // Greedy tokens of `prompt` run alone.
  std::vector<uint32_t> alone(const std::vector<uint32_t>& prompt, int new_tokens) {
    LlamaRunner runner(*weights_, pool_, 256);
    auto logits = runner.forward(prompt);
    std::vector<uint32_t> out;
    for (int i = 0; i < new_tokens; ++i) {
      uint32_t next =
          static_cast<uint32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
      out.push_back(next);
      logits = runner.forward(std::span<const uint32_t>(&next, 1));
    }
    return out;
  }

  // Runs until idle; returns each request's tokens and asserts the step invariants.
  std::map<uint64_t, std::vector<uint32_t>> drain(Scheduler& scheduler, int64_t max_steps = 1000) {
    std::map<uint64_t, std::vector<uint32_t>> out;
    for (int64_t step = 0; step < max_steps && !scheduler.idle(); ++step) {
      auto events = scheduler.step();
      EXPECT_TRUE(events.ok()) << events.status();
      if (!events.ok()) break;
      for (const TokenEvent& e : *events) out[e.id].push_back(e.token);
    }
    EXPECT_TRUE(scheduler.idle());
    return out;
  }

  cpu::ThreadPool pool_{2};
  std::mt19937 rng_{5};
  std::unique_ptr<LlamaWeights> weights_;
  std::unique_ptr<TpGroup> group_;
};

TEST_F(SchedulerTest, ContinuousBatchingGivesEachRequestItsOwnGreedyTokens) {
  // A budget smaller than the prompts forces chunked prefill; requests join mid-flight.
  Scheduler scheduler(withBlocks(64), nullptr, {.max_batch_tokens = 16, .max_sequences = 3});
  std::vector<std::vector<uint32_t>> prompts = {randomPrompt(5), randomPrompt(37), randomPrompt(12),
                                                randomPrompt(21), randomPrompt(3)};
  const int new_tokens = 6;
  for (uint64_t id = 0; id < 3; ++id) {
    ASSERT_TRUE(
        scheduler.add({.id = id, .prompt = prompts[id], .stop = {.max_new_tokens = new_tokens}})
            .ok());
  }
  std::map<uint64_t, std::vector<uint32_t>> got;
  for (int step = 0; step < 3; ++step) {
    auto events = scheduler.step();
    ASSERT_TRUE(events.ok());
    for (const TokenEvent& e : *events) got[e.id].push_back(e.token);
  }
  for (uint64_t id = 3; id < 5; ++id) {
    ASSERT_TRUE(
        scheduler.add({.id = id, .prompt = prompts[id], .stop = {.max_new_tokens = new_tokens}})
            .ok());
  }
  for (auto& [id, tokens] : drain(scheduler))
    got[id].insert(got[id].end(), tokens.begin(), tokens.end());
  for (uint64_t id = 0; id < 5; ++id)
    EXPECT_EQ(got[id], alone(prompts[id], new_tokens)) << "request " << id;
  EXPECT_EQ(scheduler.cache().freeBlocks(), scheduler.cache().totalBlocks());
}

// Qwen3.5's linear-attention layers: each running sequence holds one of the group's two
// state slots, so at most two run though four may; chunked prefills (a budget of 6 tokens)
// and requests that join as others finish still give transformers' greedy tokens, with
// prefix caching and drafts asked for (both off without slots for checkpoints and drafts'
// rows: a second run of a prompt computes it whole).
TEST(LinearAttentionSchedulerTest, SequencesTakeTurnsOnTheStateSlots) {
  const std::string folder = std::string(CLEAVE_GOLDEN_DIR) + "/engine/hf/qwen3_5_f32";
  std::ifstream in(folder + "/logits.json");
  ASSERT_TRUE(in.good()) << folder;
  const nlohmann::json golden = nlohmann::json::parse(in);
  auto group = TpGroup::load(folder, {.tp = 1, .threads = 2});
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_FALSE((*group)->allocateKv(64, 4).ok());  // No state slots.
  ASSERT_TRUE((*group)->allocateKv(64, 4, 0, /*state_slots=*/2).ok());
  Scheduler scheduler(**group, nullptr,
                      {.max_batch_tokens = 6,
                       .max_sequences = 4,
                       .prefix_caching = true,
                       .speculative = {.tokens = 3}});
  std::vector<std::vector<uint32_t>> prompts, want;
  for (const auto& prompt : golden["prompts"]) {
    prompts.push_back(prompt["ids"].get<std::vector<uint32_t>>());
    want.push_back(prompt["greedy_next"].get<std::vector<uint32_t>>());
  }
  prompts.push_back(prompts[2]);  // Again: computed whole, from a fresh state.
  want.push_back(want[2]);
  for (uint64_t id = 0; id < prompts.size(); ++id) {
    ASSERT_TRUE(scheduler
                    .add({.id = id,
                          .prompt = prompts[id],
                          .stop = {.max_new_tokens = static_cast<int64_t>(want[id].size())}})
                    .ok());
  }
  std::map<uint64_t, std::vector<uint32_t>> got;
  int64_t most = 0;
  for (int step = 0; step < 200 && !scheduler.idle(); ++step) {
    auto events = scheduler.step();
    ASSERT_TRUE(events.ok()) << events.status();
    most = std::max(most, scheduler.runningSequences());
    for (const TokenEvent& e : *events) got[e.id].push_back(e.token);
  }
  ASSERT_TRUE(scheduler.idle());
  EXPECT_EQ(most, 2);
  for (uint64_t id = 0; id < prompts.size(); ++id) EXPECT_EQ(got[id], want[id]) << "request " << id;
  EXPECT_EQ(scheduler.prefixHitTokens(), 0);
  EXPECT_EQ(scheduler.draftedTokens(), 0);
  EXPECT_EQ(scheduler.cache().freeBlocks(), scheduler.cache().totalBlocks());

  // Reserved: the prefill leaves its state in the reservation's slot for the decode, which
  // continues it; with both slots reserved a third reservation waits for one.
  const std::vector<uint32_t>& prompt = prompts[1];
  const int64_t total = static_cast<int64_t>(prompt.size() + want[1].size());
  ASSERT_TRUE(scheduler.reserve(7, (total + 3) / 4).ok());
  ASSERT_TRUE(scheduler.reserve(8, 1).ok());
  auto third = scheduler.reserve(9, 1);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("state slots is held"));
  EXPECT_EQ(scheduler.release(8), 1);
  const StopCriteria stop{.max_new_tokens = static_cast<int64_t>(want[1].size())};
  auto drain = [](Scheduler& scheduler) {
    std::map<uint64_t, std::vector<uint32_t>> out;
    for (int step = 0; step < 100 && !scheduler.idle(); ++step) {
      auto events = scheduler.step();
      EXPECT_TRUE(events.ok()) << events.status();
      if (!events.ok()) break;
      for (const TokenEvent& e : *events) out[e.id].push_back(e.token);
    }
    return out;
  };
  ASSERT_TRUE(scheduler.addPrefill({.id = 7, .prompt = prompt, .stop = stop}).ok());
  std::map<uint64_t, std::vector<uint32_t>> first = drain(scheduler);
  ASSERT_EQ(first[7].size(), 1u);
  ASSERT_TRUE(scheduler.startDecode({.id = 7, .prompt = prompt, .stop = stop}, first[7][0]).ok());
  std::map<uint64_t, std::vector<uint32_t>> rest = drain(scheduler);
  first[7].insert(first[7].end(), rest[7].begin(), rest[7].end());
  EXPECT_EQ(first[7], want[1]);
  EXPECT_EQ(scheduler.cache().freeBlocks(), scheduler.cache().totalBlocks());
  EXPECT_TRUE(scheduler.reserve(9, 1).ok() && scheduler.reserve(10, 1).ok());  // Both free.
}

// Prefix caching of a linear-attention model (Qwen3.5): cached prefixes end at state
// checkpoints, and a prompt that reuses one computes only the rest from a copy of that state.
// Every request's greedy tokens and their log-probabilities are those of a scheduler
// without prefix caching on another group (of one rank), whatever the checkpoints' turnover;
// with one rank and with two (each rank's checkpoint holds its key heads' state).
class StateCheckpointTest : public ::testing::TestWithParam<int> {
 protected:
  static constexpr int64_t kSequenceSlots = 2;
  static constexpr int64_t kCheckpoints = 6;
  static constexpr int kNewTokens = 5;

  void SetUp() override {
    const std::string folder = std::string(CLEAVE_GOLDEN_DIR) + "/engine/hf/qwen3_5_f32";
    for (auto* group : {&cached_, &plain_}) {
      auto loaded = TpGroup::load(folder, {.tp = group == &cached_ ? GetParam() : 1, .threads = 2});
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      *group = std::move(*loaded);
    }
    ASSERT_TRUE(cached_->allocateKv(96, 4, 0, kSequenceSlots + kCheckpoints).ok());
    ASSERT_TRUE(plain_->allocateKv(96, 4, 0, kSequenceSlots).ok());
    // Chunks of at most 6 tokens: they end on the block boundaries of 4 (4, 8, ...).
    reschedule(6, kCheckpoints);
    reference_ = std::make_unique<Scheduler>(
        *plain_, nullptr,
        SchedulerOptions{
            .max_batch_tokens = 6, .max_sequences = kSequenceSlots, .prefix_caching = true});
  }

  // A fresh scheduler on the cached group: steps of `batch_tokens`, `checkpoints` slots.
  void reschedule(int64_t batch_tokens, int64_t checkpoints) {
    scheduler_ = std::make_unique<Scheduler>(*cached_, nullptr,
                                             SchedulerOptions{.max_batch_tokens = batch_tokens,
                                                              .max_sequences = kSequenceSlots,
                                                              .prefix_caching = true,
                                                              .state_checkpoints = checkpoints});
  }

  std::vector<uint32_t> randomTokens(int length) {
    std::vector<uint32_t> p(length);
    for (auto& id : p) id = rng_() % cached_->config().vocab_size;
    return p;
  }
  static std::vector<uint32_t> join(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  GenerationRequest request(uint64_t id, const std::vector<uint32_t>& prompt,
                            int64_t new_tokens = kNewTokens) const {
    return {.id = id,
            .prompt = prompt,
            .sampling = {.logprobs = 0},
            .stop = {.max_new_tokens = new_tokens},
            .adjustments = adjustments_};
  }

  struct Output {
    std::vector<uint32_t> tokens;
    std::vector<float> logprobs;
    int64_t cached = 0;
  };
  static std::map<uint64_t, Output> drain(Scheduler& scheduler) {
    std::map<uint64_t, Output> out;
    for (int step = 0; step < 300 && !scheduler.idle(); ++step) {
      auto events = scheduler.step();
      EXPECT_TRUE(events.ok()) << events.status();
      if (!events.ok()) break;
      for (const TokenEvent& e : *events) {
        Output& o = out[e.id];
        if (o.tokens.empty()) o.cached = e.cached_tokens;
        o.tokens.push_back(e.token);
        o.logprobs.push_back(e.logprob.value_or(NAN));
      }
    }
    EXPECT_TRUE(scheduler.idle());
    return out;
  }

  // Runs `prompts` together (ids from `first`) on the cached scheduler and, one by one, on
  // the reference; checks they agree and returns the cached run's prefix hits.
  std::vector<int64_t> run(const std::vector<std::vector<uint32_t>>& prompts, uint64_t first,
                           int64_t new_tokens = kNewTokens) {
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_TRUE(scheduler_->add(request(first + i, prompts[i], new_tokens)).ok());
    std::map<uint64_t, Output> got = drain(*scheduler_);
    last_ = got;
    std::vector<int64_t> hits;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_TRUE(reference_->add(request(first + i, prompts[i], new_tokens)).ok());
      const Output want = drain(*reference_)[first + i];
      const Output& have = got[first + i];
      EXPECT_EQ(have.tokens, want.tokens) << "request " << first + i;
      EXPECT_EQ(have.logprobs.size(), want.logprobs.size());
      for (size_t t = 0; t < have.logprobs.size() && t < want.logprobs.size(); ++t)
        EXPECT_NEAR(have.logprobs[t], want.logprobs[t], 1e-4) << "request " << first + i;
      hits.push_back(have.cached);
    }
    return hits;
  }

  // Reserves the blocks of request `id` (its prompt and kNewTokens), given the prompt: how
  // many came from the cache.
  int64_t reserveWith(uint64_t id, const std::vector<uint32_t>& prompt) {
    int64_t cached = -1;
    const int64_t total = static_cast<int64_t>(prompt.size()) + kNewTokens;
    EXPECT_TRUE(scheduler_->reserve(id, (total + 3) / 4, prompt, &cached).ok());
    return cached;
  }
  // Prefills reserved request `id` (its first token's Output), then decodes it in the
  // reservation, as a combined worker does; checks its tokens against the reference's and
  // returns them.
  std::vector<uint32_t> prefillThenDecode(uint64_t id, const std::vector<uint32_t>& prompt,
                                          const std::function<void(const Output&)>& prefilled) {
    EXPECT_TRUE(scheduler_->addPrefill(request(id, prompt)).ok());
    const Output first = drain(*scheduler_)[id];
    EXPECT_EQ(first.tokens.size(), 1u);
    if (first.tokens.size() != 1) return {};
    prefilled(first);
    EXPECT_TRUE(scheduler_->startDecode(request(id, prompt), first.tokens[0]).ok());
    std::vector<uint32_t> tokens = first.tokens;
    const Output rest = drain(*scheduler_)[id];
    tokens.insert(tokens.end(), rest.tokens.begin(), rest.tokens.end());
    EXPECT_TRUE(reference_->add(request(id, prompt)).ok());
    EXPECT_EQ(tokens, drain(*reference_)[id].tokens);
    return tokens;
  }

  std::mt19937 rng_{11};
  LogitAdjustments adjustments_;     // Every request's.
  std::map<uint64_t, Output> last_;  // The last run()'s outputs on the cached scheduler.
  std::unique_ptr<TpGroup> cached_, plain_;
  std::unique_ptr<Scheduler> scheduler_, reference_;
};

TEST_P(StateCheckpointTest, AConversationsNextTurnResumesPastTheReply) {
  const std::vector<uint32_t> first = randomTokens(23);
  // Its chunks end at 4, 8, ..., 20 (the last boundary before its end), then 23; decoding
  // its first token completes the block at 24.
  EXPECT_EQ(run({first}, 0), std::vector<int64_t>{0});
  EXPECT_EQ(scheduler_->stateCheckpoints(), 6);
  // The next turn: the prompt, the reply, a new message. It resumes at 24, in the reply.
  const std::vector<uint32_t> second = join(join(first, last_[0].tokens), randomTokens(6));
  EXPECT_EQ(run({second}, 1), std::vector<int64_t>{24});
  // The same prompt again resumes at its last boundary; one sharing 18 tokens at 16.
  EXPECT_EQ(run({first}, 2), std::vector<int64_t>{20});
  const std::vector<uint32_t> branch =
      join(std::vector<uint32_t>(first.begin(), first.begin() + 18), randomTokens(6));
  EXPECT_EQ(run({branch}, 3), std::vector<int64_t>{16});
  // One sharing 3 tokens (less than a block) finds nothing.
  const std::vector<uint32_t> stranger =
      join(std::vector<uint32_t>(first.begin(), first.begin() + 3), randomTokens(10));
  EXPECT_EQ(run({stranger}, 4), std::vector<int64_t>{0});
  EXPECT_EQ(scheduler_->stateCheckpoints(), kCheckpoints);
  EXPECT_EQ(scheduler_->prefixHitTokens(), 24 + 20 + 16);
  EXPECT_EQ(scheduler_->cache().freeBlocks(), scheduler_->cache().totalBlocks());
}

TEST_P(StateCheckpointTest, PromptsArrivingTogetherComputeTheirSharedPrefixOnce) {
  const std::vector<uint32_t> system = randomTokens(17);
  const std::vector<int64_t> hits =
      run({join(system, randomTokens(5)), join(system, randomTokens(8))}, 0);
  // The second waits for each of the first's chunks and continues from its checkpoints, up
  // to 16 (the shared prefix's last boundary), then computes its own rest.
  EXPECT_EQ(hits, (std::vector<int64_t>{0, 16}));
  EXPECT_EQ(scheduler_->cache().freeBlocks(), scheduler_->cache().totalBlocks());
}

TEST_P(StateCheckpointTest, AReservationKeepsItsCheckpointWhileOthersGiveWay) {
  // A reservation made with its prompt counts on the checkpoint that ends its cached
  // blocks: the prompts that pass through every other checkpoint slot meanwhile leave it,
  // and the prefill resumes there.
  const std::vector<uint32_t> kept = randomTokens(13);  // Checkpoints at 4, 8 and 12.
  EXPECT_EQ(run({kept}, 0), std::vector<int64_t>{0});
  const std::vector<uint32_t> prompt = join(kept, randomTokens(6));
  EXPECT_EQ(reserveWith(50, prompt), 3);
  // Six checkpoints each (4, ..., 24): more than the five slots left.
  for (uint64_t id = 1; id <= 3; ++id) EXPECT_EQ(run({randomTokens(26)}, id)[0], 0);
  // 8 is gone: a prompt sharing 9 of `kept`'s tokens finds nothing.
  EXPECT_EQ(run({join(std::vector<uint32_t>(kept.begin(), kept.begin() + 9), randomTokens(4))}, 4),
            std::vector<int64_t>{0});
  prefillThenDecode(50, prompt, [](const Output& first) { EXPECT_EQ(first.cached, 12); });
  EXPECT_EQ(scheduler_->cache().freeBlocks(), scheduler_->cache().totalBlocks());
}

// Two checkpoint slots: a sequence that is to start from a checkpoint keeps it while it waits
// for room in a step (another prompt's chunks, which save their own, take the whole
// budget); cancelled while waiting, it lets it go.
TEST_P(StateCheckpointTest, ASequenceKeepsTheCheckpointItWillStartFrom) {
  reschedule(4, 2);
  // Leaves the checkpoints at 12 (its prompt's last boundary) and 16 (its decoding's).
  const std::vector<uint32_t> kept = randomTokens(13);
  EXPECT_EQ(run({kept}, 0), std::vector<int64_t>{0});
  EXPECT_EQ(scheduler_->stateCheckpoints(), 2);
  const std::vector<uint32_t> next = join(kept, randomTokens(5));
  EXPECT_EQ(run({randomTokens(20), next}, 1), (std::vector<int64_t>{0, 12}));

  reschedule(4, 2);
  EXPECT_EQ(run({kept}, 10), std::vector<int64_t>{0});
  ASSERT_TRUE(scheduler_->add(request(11, randomTokens(20))).ok());
  ASSERT_TRUE(scheduler_->add(request(12, next)).ok());
  ASSERT_TRUE(scheduler_->step().ok());  // 12 waits, holding the checkpoint at 12.
  EXPECT_TRUE(scheduler_->cancel(12));
  drain(*scheduler_);
  // Request 11's chunks took its slot once 12 let go: nothing resumes at 12.
  EXPECT_EQ(run({next}, 13), std::vector<int64_t>{0});
  EXPECT_EQ(scheduler_->cache().freeBlocks(), scheduler_->cache().totalBlocks());
}

// A system prompt shorter than a chunk: the first prompt leaves no checkpoint inside it, but
// the second, whose cached blocks end where the two part, leaves one there, and the third
// resumes from it.
TEST_P(StateCheckpointTest, ASharedPrefixGetsACheckpointWhereThePromptsPart) {
  reschedule(64, kCheckpoints);
  const std::vector<uint32_t> system = randomTokens(18);
  EXPECT_EQ(run({join(system, randomTokens(7))}, 0), std::vector<int64_t>{0});
  EXPECT_EQ(run({join(system, randomTokens(9))}, 1), std::vector<int64_t>{0});
  EXPECT_EQ(run({join(system, randomTokens(5))}, 2), std::vector<int64_t>{16});
  EXPECT_EQ(scheduler_->cache().freeBlocks(), scheduler_->cache().totalBlocks());
}

// A decoding sequence keeps one checkpoint of its output, its latest: ten tokens cross the
// boundaries at 16 and 20, and the second takes the first one's slot.
TEST_P(StateCheckpointTest, DecodingKeepsItsLatestCheckpointOnly) {
  reschedule(64, kCheckpoints);
  const std::vector<uint32_t> first = randomTokens(13);
  EXPECT_EQ(run({first}, 0, 10), std::vector<int64_t>{0});
  EXPECT_EQ(scheduler_->stateCheckpoints(), 2);  // 12 (its prompt's) and 20 (its output's).
  const std::vector<uint32_t> next = join(join(first, last_[0].tokens), randomTokens(4));
  EXPECT_EQ(run({next}, 1), std::vector<int64_t>{20});
}

// Prompts arriving together whose shared prefix ends before the first one's chunk does: that
// chunk leaves no checkpoint the second could start from, so the second does not wait a step
// for it, and both have their first token after two steps (the last chunks stop at 20).
TEST_P(StateCheckpointTest, APromptWaitsOnlyForACheckpointItCanUse) {
  reschedule(64, kCheckpoints);
  const std::vector<uint32_t> system = randomTokens(8);
  const std::vector<std::vector<uint32_t>> prompts = {join(system, randomTokens(13)),
                                                      join(system, randomTokens(15))};
  for (uint64_t id = 0; id < 2; ++id) ASSERT_TRUE(scheduler_->add(request(id, prompts[id])).ok());
  std::map<uint64_t, Output> got;
  for (int step = 0; step < 2; ++step) {
    auto events = scheduler_->step();
    ASSERT_TRUE(events.ok()) << events.status();
    for (const TokenEvent& e : *events) got[e.id].tokens.push_back(e.token);
  }
  EXPECT_EQ(got[0].tokens.size(), 1u);
  EXPECT_EQ(got[1].tokens.size(), 1u);
  for (auto& [id, out] : drain(*scheduler_))
    got[id].tokens.insert(got[id].tokens.end(), out.tokens.begin(), out.tokens.end());
  for (uint64_t id = 0; id < 2; ++id) {
    ASSERT_TRUE(reference_->add(request(id, prompts[id])).ok());
    EXPECT_EQ(got[id].tokens, drain(*reference_)[id].tokens) << "request " << id;
  }
}

// A reservation holds the checkpoint its cached blocks end at only until its prefill (then
// its sequence holds what it starts from, until that has run): a prompt passing through both
// slots afterwards evicts it though the reservation is still held. Decoding in the
// reservation, as a combined worker does, leaves the output's checkpoint for the next turn.
TEST_P(StateCheckpointTest, AReservationsPinEndsAtItsPrefill) {
  reschedule(4, 2);
  const std::vector<uint32_t> kept = randomTokens(13);  // Checkpoints at 12 and 16.
  EXPECT_EQ(run({kept}, 0), std::vector<int64_t>{0});
  const std::vector<uint32_t> prompt = join(kept, randomTokens(6));
  EXPECT_EQ(reserveWith(50, prompt), 3);
  const std::vector<uint32_t> tokens = prefillThenDecode(50, prompt, [&](const Output& first) {
    EXPECT_EQ(first.cached, 12);
    // Between the prefill and the decode, the reservation held.
    EXPECT_EQ(run({randomTokens(20)}, 51), std::vector<int64_t>{0});
    EXPECT_EQ(run({join(kept, randomTokens(5))}, 52), std::vector<int64_t>{0});  // 12 is gone.
  });
  EXPECT_EQ(run({join(join(prompt, tokens), randomTokens(3))}, 53), std::vector<int64_t>{20});
  EXPECT_EQ(scheduler_->cache().freeBlocks(), scheduler_->cache().totalBlocks());
}

// A prompt's last chunk stops early at its last block boundary only to leave a checkpoint
// there: with the one checkpoint slot held by a reservation, a 13-token prompt is computed in
// one chunk and samples its first token in its first step.
TEST_P(StateCheckpointTest, TheLastChunkStopsEarlyOnlyToLeaveACheckpoint) {
  reschedule(64, 1);
  const std::vector<uint32_t> kept = randomTokens(13);
  EXPECT_EQ(run({kept}, 0), std::vector<int64_t>{0});  // Leaves its output's, at 16.
  const std::vector<uint32_t> turn = join(join(kept, last_[0].tokens), randomTokens(2));
  EXPECT_EQ(reserveWith(50, turn), 4);  // It holds the checkpoint at 16.
  ASSERT_TRUE(scheduler_->add(request(1, randomTokens(13))).ok());
  auto events = scheduler_->step();
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].id, 1u);
  drain(*scheduler_);
  EXPECT_EQ(scheduler_->release(50), (static_cast<int64_t>(turn.size()) + kNewTokens + 3) / 4);
  EXPECT_EQ(scheduler_->cache().freeBlocks(), scheduler_->cache().totalBlocks());
}

// Drafts verified on Qwen3.5 (speculative decoding by prompt lookup): the state after each
// draft's row is kept in a slot of its own, and a sequence whose drafts are rejected goes on
// from the state after the last row it keeps. Greedy tokens and their log-probabilities are
// those of one token a step (the reference), with drafts both accepted and rejected: without
// prefix caching; with it (drafts stop short of a token that completes a block, whose step
// leaves a checkpoint), where the next turn resumes past the reply; and in a reservation.
// The requests may draw only three tokens (allowed_token_ids), so that output repeats and
// drafts come right (this random model's output does not repeat), while which of the three
// and its log-probability still follow the state.
TEST_P(StateCheckpointTest, RejectedDraftsLeaveTheStateOfTheRowsKept) {
  constexpr int64_t kDraftStates = 5;
  ASSERT_TRUE(cached_->allocateKv(96, 4, 0, kSequenceSlots + kDraftStates + kCheckpoints).ok());
  const std::vector<uint32_t> cycle = randomTokens(5);
  adjustments_.allowed = {cycle[0], cycle[1], cycle[2]};
  const std::vector<uint32_t> looping = join(join(join(cycle, cycle), cycle), cycle);
  const std::vector<uint32_t> other = join(randomTokens(7), join(cycle, cycle));
  int64_t drafted = 0, accepted = 0;
  for (const bool caching : {false, true}) {
    scheduler_ = std::make_unique<Scheduler>(
        *cached_, nullptr,
        SchedulerOptions{.max_batch_tokens = 16,
                         .max_sequences = kSequenceSlots,
                         .prefix_caching = caching,
                         .state_checkpoints = kCheckpoints,
                         .draft_states = kDraftStates,
                         .speculative = {.tokens = 3, .ngram = {.min = 1, .max = 3}}});
    run({looping, other}, caching ? 10 : 0, 24);
    drafted += scheduler_->draftedTokens();
    accepted += scheduler_->acceptedTokens();
    EXPECT_GT(scheduler_->draftedTokens(), 0) << "prefix caching " << caching;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  const std::vector<uint32_t> next = join(join(looping, last_[10].tokens), randomTokens(3));
  EXPECT_GT(run({next}, 20, 8)[0], static_cast<int64_t>(looping.size()));
  // Reserved: the slot a rejection leaves the sequence in is the reservation's to free.
  const std::vector<uint32_t> reserved = join(randomTokens(3), looping);
  EXPECT_GE(reserveWith(30, reserved), 0);
  const int64_t before = scheduler_->draftedTokens() - scheduler_->acceptedTokens();
  prefillThenDecode(30, reserved, [](const Output&) {});
  EXPECT_GT(scheduler_->draftedTokens() - scheduler_->acceptedTokens(), before);  // Rejections.
  run({other, looping}, 40, 12);  // Two sequences at once: their slots must be apart.
  EXPECT_EQ(scheduler_->freeDraftStates(), kDraftStates);
  EXPECT_EQ(scheduler_->cache().freeBlocks(), scheduler_->cache().totalBlocks());
}

INSTANTIATE_TEST_SUITE_P(Ranks, StateCheckpointTest, ::testing::Values(1, 2));

// A model that takes at most two sequences a step (a GPU model's batch): the other prefills
// wait for a later step, and every request still gets its own greedy tokens.
TEST_F(SchedulerTest, StepsHoldAtMostTheModelsSequences) {
  Scheduler scheduler(withBlocks(64), nullptr,
                      {.max_batch_tokens = 64, .max_sequences = 4, .max_step_sequences = 2});
  std::vector<std::vector<uint32_t>> prompts = {randomPrompt(5), randomPrompt(9), randomPrompt(3),
                                                randomPrompt(7)};
  for (uint64_t id = 0; id < prompts.size(); ++id) {
    ASSERT_TRUE(
        scheduler.add({.id = id, .prompt = prompts[id], .stop = {.max_new_tokens = 4}}).ok());
  }
  std::map<uint64_t, std::vector<uint32_t>> got;
  int64_t widest = 0;
  for (int step = 0; step < 100 && !scheduler.idle(); ++step) {
    auto events = scheduler.step();
    ASSERT_TRUE(events.ok()) << events.status();
    widest = std::max(widest, scheduler.lastBatchSequences());
    for (const TokenEvent& e : *events) got[e.id].push_back(e.token);
  }
  EXPECT_EQ(widest, 2);
  for (uint64_t id = 0; id < prompts.size(); ++id)
    EXPECT_EQ(got[id], alone(prompts[id], 4)) << "request " << id;
}

TEST_F(SchedulerTest, WaitsForKvInsteadOfOvercommittingAndFreesEverything) {
  // Each request needs 3 blocks of 4 (5 + 6 tokens); 7 blocks hold two at a time.
  Scheduler scheduler(withBlocks(7), nullptr, {.max_batch_tokens = 64, .max_sequences = 8});
  for (uint64_t id = 0; id < 4; ++id) {
    ASSERT_TRUE(
        scheduler.add({.id = id, .prompt = randomPrompt(5), .stop = {.max_new_tokens = 6}}).ok());
  }
  auto first = scheduler.step();
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(scheduler.runningSequences(), 2);
  EXPECT_EQ(scheduler.waitingRequests(), 2);
  EXPECT_EQ(scheduler.cache().freeBlocks(), 1);
  auto tokens = drain(scheduler);
  EXPECT_EQ(tokens.size(), 4u);
  for (auto& [id, t] : tokens)
    EXPECT_EQ(t.size() + (id < 2 ? 1u : 0u), 6u) << id;  // First step's token above.
  EXPECT_EQ(scheduler.cache().freeBlocks(), 7);
}

TEST_F(SchedulerTest, CancelFreesBlocksAndStopTokensEndSequences) {
  Scheduler scheduler(withBlocks(32), nullptr, {.max_batch_tokens = 64, .max_sequences = 8});
  std::vector<uint32_t> prompt = randomPrompt(9);
  std::vector<uint32_t> greedy = alone(prompt, 4);
  ASSERT_TRUE(scheduler
                  .add({.id = 1,
                        .prompt = prompt,
                        .stop = {.stop_token_ids = {greedy[2]}, .max_new_tokens = 50}})
                  .ok());
  ASSERT_TRUE(
      scheduler.add({.id = 2, .prompt = randomPrompt(9), .stop = {.max_new_tokens = 50}}).ok());
  ASSERT_TRUE(scheduler.step().ok());
  EXPECT_TRUE(scheduler.cancel(2));
  EXPECT_FALSE(scheduler.cancel(99));
  std::vector<TokenEvent> events;
  while (!scheduler.idle()) {
    auto step = scheduler.step();
    ASSERT_TRUE(step.ok());
    events.insert(events.end(), step->begin(), step->end());
  }
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.back().finished);
  EXPECT_EQ(events.back().reason, StopReason::kStopToken);
  EXPECT_EQ(events.back().token, greedy[2]);
  EXPECT_EQ(scheduler.cache().freeBlocks(), 32);
}

TEST_F(SchedulerTest, PrefixCacheHitsGiveTheSameTokensAsMisses) {
  Scheduler scheduler(withBlocks(64), nullptr, {.max_batch_tokens = 64, .max_sequences = 4});
  std::vector<uint32_t> shared = randomPrompt(33);
  std::vector<uint32_t> other = shared;
  other.resize(30);  // Shares 7 full blocks (28 tokens) with `shared`.
  std::vector<uint32_t> tail = randomPrompt(6);
  other.insert(other.end(), tail.begin(), tail.end());
  ASSERT_TRUE(scheduler.add({.id = 1, .prompt = shared, .stop = {.max_new_tokens = 5}}).ok());
  auto first = drain(scheduler);
  EXPECT_EQ(scheduler.prefixHitTokens(), 0);
  ASSERT_TRUE(scheduler.add({.id = 2, .prompt = shared, .stop = {.max_new_tokens = 5}}).ok());
  ASSERT_TRUE(scheduler.add({.id = 3, .prompt = other, .stop = {.max_new_tokens = 5}}).ok());
  auto second = drain(scheduler);
  // Request 2 reuses 32 tokens (8 blocks; one prompt token is always computed), request 3 28.
  EXPECT_EQ(scheduler.prefixHitTokens(), 32 + 28);
  EXPECT_EQ(first[1], alone(shared, 5));
  EXPECT_EQ(second[2], first[1]);
  EXPECT_EQ(second[3], alone(other, 5));
  EXPECT_EQ(scheduler.cache().freeBlocks(), 64);
}

// A cache salt keeps prefixes apart: only requests of one salt (and one adapter) share
// cached blocks, whichever way they join (add(), or reserve() with the prompt); the tokens
// are the same either way.
TEST_F(SchedulerTest, RequestsShareCachedPrefixesOnlyWithinTheirCacheSalt) {
  Scheduler scheduler(withBlocks(64), nullptr, {.max_batch_tokens = 64, .max_sequences = 4});
  const std::vector<uint32_t> prompt = randomPrompt(33);
  auto run = [&](uint64_t id, const std::string& salt) {
    const int64_t hits = scheduler.prefixHitTokens();
    EXPECT_TRUE(
        scheduler
            .add({.id = id, .prompt = prompt, .stop = {.max_new_tokens = 5}, .cache_salt = salt})
            .ok());
    auto tokens = drain(scheduler);
    EXPECT_EQ(tokens[id], alone(prompt, 5)) << "salt '" << salt << "'";
    return scheduler.prefixHitTokens() - hits;
  };
  EXPECT_EQ(run(1, "tenant-a"), 0);
  EXPECT_EQ(run(2, "tenant-b"), 0);
  EXPECT_EQ(run(3, ""), 0);
  EXPECT_EQ(run(4, "tenant-a"), 32);  // 8 full blocks; the last token is always computed.
  EXPECT_EQ(run(5, ""), 32);
  int64_t cached = -1;
  ASSERT_TRUE(scheduler.reserve(6, 10, prompt, &cached, -1, "tenant-c").ok());
  EXPECT_EQ(cached, 0);
  ASSERT_TRUE(scheduler.reserve(7, 10, prompt, &cached, -1, "tenant-b").ok());
  EXPECT_EQ(cached, 8);
  scheduler.release(6);
  scheduler.release(7);
  EXPECT_EQ(scheduler.cache().freeBlocks(), 64);
}

// Every event of `scheduler` until it is idle.
std::vector<TokenEvent> events(Scheduler& scheduler) {
  std::vector<TokenEvent> out;
  for (int step = 0; step < 1000 && !scheduler.idle(); ++step) {
    auto events = scheduler.step();
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok()) break;
    out.insert(out.end(), events->begin(), events->end());
  }
  EXPECT_TRUE(scheduler.idle());
  return out;
}

// Reserved prefills (a prefill worker computing for a peer, or a worker prefilling for its
// own decode) take the cached prefix's blocks and compute only the rest; decoding from
// those blocks gives the tokens of the prompt run alone.
// A prefill asked for its hidden state returns the model's last hidden state at the prompt's
// last token, after the final norm: projected by the output matrix, it gives the logits the
// model computes for that prompt (which llama_model_test checks against transformers). A
// prompt chunked over steps, or taking its prefix from the cache, gives the same state.
TEST_F(SchedulerTest, APrefillsHiddenStateProjectsToItsLogits) {
  Scheduler scheduler(withBlocks(64), nullptr, {.max_batch_tokens = 16, .max_sequences = 8});
  const std::vector<uint32_t> prompt = randomPrompt(22);
  const int64_t hidden = weights_->config.hidden_size;
  const int64_t vocab = weights_->config.vocab_size;
  std::vector<float> logits;
  {
    LlamaRunner runner(*weights_, pool_, 256);
    auto computed = runner.forward(prompt);
    ASSERT_TRUE(computed.ok()) << computed.status();
    logits.assign(computed->begin(), computed->end());
  }
  std::vector<float> output(vocab * hidden, std::nanf(""));
  ASSERT_TRUE(cpu::dequantizeRows(weights_->output.source(), 0, vocab, output.data()).ok());
  std::vector<std::vector<float>> states;
  for (uint64_t id = 1; id <= 2; ++id) {  // The second finds the first's blocks cached.
    ASSERT_TRUE(scheduler.reserve(id, 6, prompt).ok());
    ASSERT_TRUE(
        scheduler
            .addPrefill(
                {.id = id, .prompt = prompt, .stop = {.max_new_tokens = 1}, .hidden_state = true})
            .ok());
    std::vector<TokenEvent> out = events(scheduler);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].cached_tokens, id == 1 ? 0 : 20);
    ASSERT_EQ(static_cast<int64_t>(out[0].hidden.size()), hidden);
    states.push_back(out[0].hidden);
    scheduler.release(id);
  }
  for (int64_t j = 0; j < vocab; ++j) {
    double projected = 0;
    for (int64_t k = 0; k < hidden; ++k)
      projected += static_cast<double>(output[j * hidden + k]) * states[0][k];
    ASSERT_NEAR(projected, logits[j], 1e-4 + 1e-4 * std::abs(logits[j])) << "token " << j;
  }
  for (int64_t k = 0; k < hidden; ++k) EXPECT_NEAR(states[1][k], states[0][k], 1e-5) << k;
  {
    // A tensor-parallel group of two returns the same state (rank 0's, whole after the
    // all-reduce).
    auto two = TpGroup::load(kTinyModel, {.tp = 2, .threads = 2});
    ASSERT_TRUE(two.ok()) << two.status();
    ASSERT_TRUE((*two)->allocateKv(16, 4).ok());
    Scheduler split(**two, nullptr, {.max_batch_tokens = 16, .max_sequences = 8});
    ASSERT_TRUE(split.reserve(1, 6).ok());
    ASSERT_TRUE(
        split
            .addPrefill(
                {.id = 1, .prompt = prompt, .stop = {.max_new_tokens = 1}, .hidden_state = true})
            .ok());
    std::vector<TokenEvent> out = events(split);
    ASSERT_EQ(out.size(), 1u);
    ASSERT_EQ(static_cast<int64_t>(out[0].hidden.size()), hidden);
    for (int64_t k = 0; k < hidden; ++k) EXPECT_NEAR(out[0].hidden[k], states[0][k], 1e-4) << k;
  }
  // Only a prefill returns one.
  EXPECT_EQ(
      scheduler
          .add({.id = 3, .prompt = prompt, .stop = {.max_new_tokens = 1}, .hidden_state = true})
          .code(),
      absl::StatusCode::kInvalidArgument);
  // A prompt that fills the context has a hidden state (no new token follows it).
  const int64_t context = weights_->config.max_position_embeddings;
  const std::vector<uint32_t> whole = randomPrompt(static_cast<int>(context));
  ASSERT_TRUE(scheduler.reserve(4, context / 4).ok());
  ASSERT_TRUE(
      scheduler
          .addPrefill(
              {.id = 4, .prompt = whole, .stop = {.max_new_tokens = 1}, .hidden_state = true})
          .ok());
  std::vector<TokenEvent> out = events(scheduler);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(static_cast<int64_t>(out[0].hidden.size()), hidden);
  EXPECT_TRUE(std::all_of(out[0].hidden.begin(), out[0].hidden.end(),
                          [](float v) { return std::isfinite(v); }));
  scheduler.release(4);
  EXPECT_EQ(scheduler.cache().freeBlocks(), 64);
}

TEST_F(SchedulerTest, ReservedPrefillsReuseTheCachedPrefix) {
  Scheduler scheduler(withBlocks(40), nullptr, {.max_batch_tokens = 16, .max_sequences = 8});
  const std::vector<uint32_t> prompt = randomPrompt(22);  // 5 full blocks reusable (20 tokens)
  const std::vector<uint32_t> want = alone(prompt, 4);
  auto request = [&](uint64_t id) {
    return GenerationRequest{.id = id, .prompt = prompt, .stop = {.max_new_tokens = 4}};
  };
  // A prefill for a peer: nothing cached yet.
  auto first = scheduler.reserve(1, 6, prompt);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(scheduler.addPrefill(request(1)).ok());
  std::vector<TokenEvent> out = events(scheduler);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].token, want[0]);
  EXPECT_EQ(out[0].cached_tokens, 0);
  EXPECT_EQ(scheduler.release(1), 6);

  // The same prompt again, reserved with it: its first five blocks are the cached ones.
  int64_t cached = -1;
  auto second = scheduler.reserve(2, 7, prompt, &cached);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(cached, 5);
  EXPECT_TRUE(std::equal(first->begin(), first->begin() + 5, second->begin()));
  ASSERT_TRUE(scheduler.reserve(2, 7, prompt, &cached).ok());  // Held already: none taken.
  EXPECT_EQ(cached, 0);
  // Another reservation sharing them: shared blocks are reserved once.
  ASSERT_TRUE(scheduler.reserve(4, 7, prompt).ok());
  EXPECT_EQ(scheduler.reservedBlocks(), 9);
  EXPECT_EQ(scheduler.release(4), 7);
  EXPECT_EQ(scheduler.reservedBlocks(), 7);
  ASSERT_TRUE(scheduler.addPrefill(request(2)).ok());
  out = events(scheduler);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].token, want[0]);
  EXPECT_EQ(out[0].cached_tokens, 20);
  ASSERT_TRUE(scheduler.startDecode(request(2), want[0]).ok());
  std::vector<uint32_t> got = {want[0]};
  for (const TokenEvent& e : events(scheduler)) got.push_back(e.token);
  EXPECT_EQ(got, want);

  // Reserved without the prompt (a worker's own decode reservation): the prefill swaps the
  // cached blocks in, and holds the ones it replaced (their ids went out) until the end.
  auto third = scheduler.reserve(3, 7);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(scheduler.freeBlocks(), 33);
  EXPECT_EQ(scheduler.reservedBlocks(), 7);
  ASSERT_TRUE(scheduler.addPrefill(request(3)).ok());
  EXPECT_EQ(scheduler.freeBlocks(), 28);
  EXPECT_EQ(scheduler.reservedBlocks(), 12);
  const std::vector<int32_t> swapped = scheduler.reservation(3);
  EXPECT_TRUE(std::equal(first->begin(), first->begin() + 5, swapped.begin()));
  EXPECT_TRUE(std::equal(third->begin() + 5, third->end(), swapped.begin() + 5));
  out = events(scheduler);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].cached_tokens, 20);
  ASSERT_TRUE(scheduler.startDecode(request(3), want[0]).ok());
  got = {want[0]};
  for (const TokenEvent& e : events(scheduler)) got.push_back(e.token);
  EXPECT_EQ(got, want);
  EXPECT_EQ(scheduler.prefixHitTokens(), 40);
  EXPECT_EQ(scheduler.prefixLookupTokens(), 3 * 22);
  EXPECT_EQ(scheduler.reservedBlocks(), 0);
  EXPECT_EQ(scheduler.freeBlocks(), 40);
}

// A request naming a LoRA adapter decodes PEFT's greedy tokens (the golden of
// tests/golden/gen_lora.py) next to base-model requests of the same prompt in one batch, and
// the prefix cache keeps each one's KV apart: a prompt is served from blocks of its own
// adapter only, generating and reserved alike.
TEST_F(SchedulerTest, AdapterRequestsGetTheAdaptersTokensAndTheirOwnPrefixCache) {
  const std::string folder = std::string(CLEAVE_GOLDEN_DIR) + "/engine/lora/llama_all_r8";
  std::ifstream in(folder + "/logits.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json golden = nlohmann::json::parse(in);
  TpGroup& group = withBlocks(80);
  ASSERT_TRUE(group.addAdapter("all", folder).ok());
  Scheduler scheduler(group, nullptr, {.max_batch_tokens = 64, .max_sequences = 8});
  const nlohmann::json& case17 = golden["prompts"][2];
  const std::vector<uint32_t> prompt = case17["ids"].get<std::vector<uint32_t>>();  // 4 blocks
  const std::vector<uint32_t> want = case17["greedy_next"].get<std::vector<uint32_t>>();
  const std::vector<uint32_t> base = alone(prompt, 8);
  ASSERT_NE(base, want);
  auto request = [&](uint64_t id, int32_t adapter) {
    return GenerationRequest{
        .id = id, .prompt = prompt, .stop = {.max_new_tokens = 8}, .adapter = adapter};
  };
  // Together: the base model's request first, so its blocks are published before the adapted
  // one looks.
  ASSERT_TRUE(scheduler.add(request(1, -1)).ok());
  ASSERT_TRUE(scheduler.add(request(2, 0)).ok());
  std::map<uint64_t, std::vector<TokenEvent>> by_id;
  for (const TokenEvent& e : events(scheduler)) by_id[e.id].push_back(e);
  auto tokens = [&](uint64_t id) {
    std::vector<uint32_t> got;
    for (const TokenEvent& e : by_id[id]) got.push_back(e.token);
    return got;
  };
  EXPECT_EQ(tokens(1), base);
  EXPECT_EQ(tokens(2), want);
  EXPECT_EQ(by_id[2][0].cached_tokens, 0);
  // Again, one after the other: each finds its own blocks.
  for (uint64_t id : {3, 4}) {
    ASSERT_TRUE(scheduler.add(request(id, id == 3 ? 0 : -1)).ok());
    for (const TokenEvent& e : events(scheduler)) by_id[e.id].push_back(e);
    EXPECT_EQ(by_id[id][0].cached_tokens, 16) << id;
  }
  EXPECT_EQ(tokens(3), want);
  EXPECT_EQ(tokens(4), base);
  // A reservation with the prompt takes the adapter's blocks; the prefill and decode into it
  // give PEFT's tokens.
  int64_t cached = -1;
  ASSERT_TRUE(scheduler.reserve(5, 7, prompt, &cached, 0).ok());
  EXPECT_EQ(cached, 4);
  ASSERT_TRUE(scheduler.addPrefill(request(5, 0)).ok());
  std::vector<TokenEvent> out = events(scheduler);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].cached_tokens, 16);
  EXPECT_EQ(out[0].token, want[0]);
  ASSERT_TRUE(scheduler.startDecode(request(5, 0), want[0]).ok());
  std::vector<uint32_t> got = {want[0]};
  for (const TokenEvent& e : events(scheduler)) got.push_back(e.token);
  EXPECT_EQ(got, want);
  // An adapter never loaded is refused.
  EXPECT_EQ(scheduler.add(request(6, 1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.reserve(6, 7, prompt, nullptr, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.freeBlocks(), 80);
}

// Prompts that arrive together with a prefix nobody has computed compute it once: the
// first computes each block, the others wait a step and take it from the cache — whether
// they generate or prefill into reservations — and decode the tokens they would alone.
TEST_F(SchedulerTest, PromptsArrivingTogetherComputeTheirSharedPrefixOnce) {
  Scheduler scheduler(withBlocks(80), nullptr, {.max_batch_tokens = 64, .max_sequences = 8});
  const std::vector<uint32_t> prefix = randomPrompt(40);  // 10 blocks of 4
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(prefix);
    const std::vector<uint32_t> tail = randomPrompt(5);
    prompts.back().insert(prompts.back().end(), tail.begin(), tail.end());
  }
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(
        scheduler.add({.id = id, .prompt = prompts[id - 1], .stop = {.max_new_tokens = 3}}).ok());
  }
  std::map<uint64_t, std::vector<TokenEvent>> by_id;
  for (const TokenEvent& e : events(scheduler)) by_id[e.id].push_back(e);
  EXPECT_EQ(scheduler.prefixHitTokens(), 40 + 40);
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_EQ(by_id[id].size(), 3u);
    EXPECT_EQ(by_id[id][0].cached_tokens, id == 1 ? 0 : 40);
    std::vector<uint32_t> got;
    for (const TokenEvent& e : by_id[id]) got.push_back(e.token);
    EXPECT_EQ(got, alone(prompts[id - 1], 3)) << id;
  }
  EXPECT_EQ(scheduler.freeBlocks(), 80);

  // Reserved prefills (a prefill worker's): the later one's own blocks give way, and come
  // back with its reservation.
  const std::vector<uint32_t> other = randomPrompt(41);
  ASSERT_TRUE(scheduler.reserve(4, 11, other).ok());
  ASSERT_TRUE(scheduler.reserve(5, 11, other).ok());
  ASSERT_TRUE(scheduler.addPrefill({.id = 4, .prompt = other, .stop = {.max_new_tokens = 2}}).ok());
  ASSERT_TRUE(scheduler.addPrefill({.id = 5, .prompt = other, .stop = {.max_new_tokens = 2}}).ok());
  std::map<uint64_t, TokenEvent> prefilled;
  for (const TokenEvent& e : events(scheduler)) prefilled[e.id] = e;
  EXPECT_EQ(prefilled[4].cached_tokens, 0);
  EXPECT_EQ(prefilled[5].cached_tokens, 40);
  EXPECT_EQ(prefilled[5].token, prefilled[4].token);
  const std::vector<int32_t> four = scheduler.reservation(4), five = scheduler.reservation(5);
  ASSERT_EQ(five.size(), 11u);
  EXPECT_TRUE(std::equal(four.begin(), four.begin() + 10, five.begin()));
  EXPECT_NE(four[10], five[10]);                   // the last token's block is each one's own
  EXPECT_EQ(scheduler.reservedBlocks(), 12 + 10);  // 10 given way, still held
  scheduler.release(4);
  scheduler.release(5);
  EXPECT_EQ(scheduler.reservedBlocks(), 0);
  EXPECT_EQ(scheduler.freeBlocks(), 80);
}

// Generated tokens' blocks are cached too: the next turn of a conversation (the prompt,
// the reply, more) reuses the reply's KV as well.
TEST_F(SchedulerTest, GeneratedTokensAreCachedForTheNextTurn) {
  Scheduler scheduler(withBlocks(40), nullptr, {.max_batch_tokens = 16, .max_sequences = 8});
  std::vector<uint32_t> prompt = randomPrompt(22);
  ASSERT_TRUE(scheduler.add({.id = 1, .prompt = prompt, .stop = {.max_new_tokens = 8}}).ok());
  std::vector<uint32_t> reply;
  for (const TokenEvent& e : events(scheduler)) reply.push_back(e.token);
  ASSERT_EQ(reply.size(), 8u);
  // KV exists for the prompt and the first 7 reply tokens (29 positions): 7 full blocks.
  std::vector<uint32_t> next = prompt;
  next.insert(next.end(), reply.begin(), reply.begin() + 6);
  const std::vector<uint32_t> more = randomPrompt(3);
  next.insert(next.end(), more.begin(), more.end());  // 31 tokens
  ASSERT_TRUE(scheduler.add({.id = 2, .prompt = next, .stop = {.max_new_tokens = 3}}).ok());
  std::vector<TokenEvent> out = events(scheduler);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].cached_tokens, 28);
  std::vector<uint32_t> got;
  for (const TokenEvent& e : out) got.push_back(e.token);
  EXPECT_EQ(got, alone(next, 3));
  EXPECT_EQ(scheduler.freeBlocks(), 40);
}

TEST_F(SchedulerTest, RequestsThatCanNeverRunAreRefusedWithTheReason) {
  Scheduler scheduler(withBlocks(4), nullptr, {});
  auto reason = [&](GenerationRequest r) {
    return std::string(scheduler.add(std::move(r)).message());
  };
  EXPECT_THAT(reason({.id = 1, .prompt = {}, .stop = {.max_new_tokens = 1}}),
              HasSubstr("prompt is empty"));
  EXPECT_THAT(reason({.id = 1, .prompt = {100000}, .stop = {.max_new_tokens = 1}}),
              HasSubstr("outside the vocabulary"));
  EXPECT_THAT(reason({.id = 1, .prompt = {1}, .stop = {}}), HasSubstr("max_new_tokens"));
  EXPECT_THAT(
      reason({.id = 1, .prompt = {1}, .sampling = {.top_p = 2}, .stop = {.max_new_tokens = 1}}),
      HasSubstr("top_p"));
  EXPECT_THAT(reason({.id = 1, .prompt = randomPrompt(10), .stop = {.max_new_tokens = 10}}),
              HasSubstr("KV blocks"));
  EXPECT_TRUE(scheduler.idle());
}

// Reserve, prefill into the reservation, then decode from the first token: the tokens of
// a request run in one go, and the reservation comes back whatever ends it.
TEST_F(SchedulerTest, ReservedPrefillThenDecodeGivesTheSameTokens) {
  Scheduler scheduler(withBlocks(40), nullptr, {.max_batch_tokens = 16, .max_sequences = 8});
  const std::vector<uint32_t> prompt = randomPrompt(21);
  const std::vector<uint32_t> want = alone(prompt, 6);
  GenerationRequest request{.id = 7, .prompt = prompt, .stop = {.max_new_tokens = 6}};

  EXPECT_EQ(scheduler.startDecode(request, want[0]).code(), absl::StatusCode::kNotFound);
  auto blocks = scheduler.reserve(7, 7);  // ceil((21 + 6) / 4)
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_EQ(*scheduler.reserve(7, 7), *blocks);  // Idempotent.
  EXPECT_EQ(scheduler.reserve(7, 8).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(scheduler.reserve(8, 40).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(scheduler.reservedBlocks(), 7);

  ASSERT_TRUE(scheduler.addPrefill(request).ok());
  std::vector<TokenEvent> prefill;
  while (!scheduler.idle()) {
    auto events = scheduler.step();
    ASSERT_TRUE(events.ok()) << events.status();
    prefill.insert(prefill.end(), events->begin(), events->end());
  }
  ASSERT_EQ(prefill.size(), 1u);
  EXPECT_TRUE(prefill[0].prefilled);
  EXPECT_FALSE(prefill[0].finished);
  EXPECT_EQ(prefill[0].token, want[0]);
  EXPECT_EQ(scheduler.reservedBlocks(), 7);  // Prefill alone keeps the reservation.

  ASSERT_TRUE(scheduler.startDecode(request, want[0]).ok());
  EXPECT_EQ(scheduler.startDecode(request, want[0]).code(), absl::StatusCode::kFailedPrecondition);
  auto rest = drain(scheduler);
  std::vector<uint32_t> got = {want[0]};
  got.insert(got.end(), rest[7].begin(), rest[7].end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(scheduler.reservedBlocks(), 0);
  EXPECT_EQ(scheduler.freeBlocks(), 40);

  // Cancel mid-decode and release of an unstarted reservation free everything too.
  ASSERT_TRUE(scheduler.reserve(9, 7).ok());
  ASSERT_TRUE(
      scheduler.startDecode({.id = 9, .prompt = prompt, .stop = {.max_new_tokens = 6}}, want[0])
          .ok());
  ASSERT_TRUE(scheduler.step().ok());
  EXPECT_TRUE(scheduler.cancel(9));
  EXPECT_FALSE(scheduler.cancel(9));
  ASSERT_TRUE(scheduler.reserve(10, 3).ok());
  EXPECT_EQ(scheduler.release(10), 3);
  EXPECT_EQ(scheduler.release(10), 0);
  EXPECT_EQ(scheduler.reservedBlocks(), 0);
  EXPECT_EQ(scheduler.freeBlocks(), 40);
  EXPECT_TRUE(scheduler.idle());

  // stop() ends a queued prefill or a sequence waiting to decode, and keeps the blocks
  // (a fenced reservation) until release().
  ASSERT_TRUE(scheduler.reserve(11, 7).ok());
  ASSERT_TRUE(
      scheduler.addPrefill({.id = 11, .prompt = prompt, .stop = {.max_new_tokens = 1}}).ok());
  ASSERT_TRUE(scheduler.reserve(12, 7).ok());
  ASSERT_TRUE(
      scheduler.startDecode({.id = 12, .prompt = prompt, .stop = {.max_new_tokens = 6}}, want[0])
          .ok());
  const int64_t held = scheduler.reservedBlocks();  // With the cached prefix's, swapped in.
  scheduler.stop(11);
  scheduler.stop(12);
  EXPECT_TRUE(scheduler.idle());
  EXPECT_TRUE(drain(scheduler).empty());
  EXPECT_EQ(scheduler.reservedBlocks(), held);
  // Blocks only some reservations hold: a block two share is either's only with both.
  const std::vector<uint64_t> both = {11, 12};
  EXPECT_EQ(scheduler.heldOnlyBy(both), held);
  EXPECT_EQ(scheduler.heldOnlyBy({}), 0);
  const std::vector<uint64_t> one = {11}, other = {12};
  EXPECT_LE(scheduler.heldOnlyBy(one) + scheduler.heldOnlyBy(other), held);
  EXPECT_GE(scheduler.heldOnlyBy(one), 2);  // Its own blocks past the cached prefix.
  // trim() frees the blocks past the first ones (a fenced reservation keeps its prompt's).
  EXPECT_EQ(scheduler.trim(12, 6), 1);
  EXPECT_EQ(scheduler.reservation(12).size(), 6u);
  EXPECT_EQ(scheduler.trim(12, 9), 0);
  EXPECT_EQ(scheduler.reservedBlocks(), held - 1);
  EXPECT_EQ(scheduler.release(11), 7);
  EXPECT_EQ(scheduler.release(12), 6);
  EXPECT_EQ(scheduler.reservedBlocks(), 0);
  EXPECT_EQ(scheduler.freeBlocks(), 40);
}

// Speculative decoding gives the tokens decoding one token a step gives: greedy (generated
// and reserved-then-decoded requests, against each run alone), and seeded sampling with
// penalties (against the same requests without drafts); drafts are accepted, stop tokens
// and max_new_tokens end a sequence inside an accepted run, and every block comes back.
TEST_F(SchedulerTest, SpeculativeDecodingGivesTheTokensOfOneTokenASteps) {
  // Prompts that repeat themselves, as text a reply quotes does; the tiny model's greedy
  // replies loop too.
  std::vector<std::vector<uint32_t>> prompts;
  for (int length : {5, 7, 9}) {
    std::vector<uint32_t> unit = randomPrompt(length), prompt;
    for (int i = 0; i < 3; ++i) prompt.insert(prompt.end(), unit.begin(), unit.end());
    prompts.push_back(prompt);
  }
  prompts.push_back(randomPrompt(11));
  const SpeculativeOptions speculative{.tokens = 4, .ngram = {.min = 1, .max = 3}};
  {
    Scheduler scheduler(withBlocks(96), nullptr,
                        {.max_batch_tokens = 64, .max_sequences = 8, .speculative = speculative});
    for (uint64_t id = 0; id < prompts.size(); ++id) {
      ASSERT_TRUE(
          scheduler.add({.id = id, .prompt = prompts[id], .stop = {.max_new_tokens = 24}}).ok());
    }
    // Reserved, prefilled, then decoded (a decode worker's sequence).
    GenerationRequest moved{.id = 9, .prompt = prompts[0], .stop = {.max_new_tokens = 3}};
    ASSERT_TRUE(scheduler.reserve(9, 5).ok());  // ceil((15 + 3) / 4)
    ASSERT_TRUE(scheduler.addPrefill(moved).ok());
    const std::vector<uint32_t> want = alone(prompts[0], 24);
    auto got = drain(scheduler);
    ASSERT_TRUE(scheduler.startDecode(moved, want[0]).ok());
    auto rest = drain(scheduler);
    for (uint64_t id = 0; id < prompts.size(); ++id)
      EXPECT_EQ(got[id], alone(prompts[id], 24)) << "request " << id;
    ASSERT_EQ(got[9].size(), 1u);
    EXPECT_THAT(rest[9], ::testing::ElementsAre(want[1], want[2]));
    std::printf("drafted %ld, accepted %ld\n", long(scheduler.draftedTokens()),
                long(scheduler.acceptedTokens()));
    EXPECT_GT(scheduler.acceptedTokens(), 8);
    EXPECT_LT(scheduler.acceptedTokens(), scheduler.draftedTokens());
    EXPECT_EQ(scheduler.freeBlocks(), 96);
    EXPECT_EQ(scheduler.reservedBlocks(), 0);
  }
  // A stop token that a draft would carry past ends the sequence at it.
  {
    const std::vector<uint32_t> want = alone(prompts[1], 24);
    Scheduler scheduler(withBlocks(96), nullptr,
                        {.max_batch_tokens = 64, .max_sequences = 8, .speculative = speculative});
    const uint32_t stop = want[20];
    const auto end = std::find(want.begin(), want.end(), stop);
    ASSERT_TRUE(scheduler
                    .add({.id = 1,
                          .prompt = prompts[1],
                          .stop = {.stop_token_ids = {stop}, .max_new_tokens = 24}})
                    .ok());
    EXPECT_EQ(drain(scheduler)[1], std::vector<uint32_t>(want.begin(), end + 1));
    EXPECT_EQ(scheduler.freeBlocks(), 96);
  }
  // Seeded sampling with penalties: the same draws with and without drafts.
  std::map<uint64_t, std::vector<uint32_t>> plain;
  for (const int64_t tokens : {int64_t{0}, int64_t{4}}) {
    Scheduler scheduler(withBlocks(96), nullptr,
                        {.max_batch_tokens = 64,
                         .max_sequences = 8,
                         .speculative = {.tokens = tokens, .ngram = speculative.ngram}});
    for (uint64_t id = 0; id < prompts.size(); ++id) {
      ASSERT_TRUE(scheduler
                      .add({.id = id,
                            .prompt = prompts[id],
                            .sampling = {.temperature = 0.05f,
                                         .top_k = 20,
                                         .repetition_penalty = 1.02f,
                                         .seed = 11 + id},
                            .stop = {.max_new_tokens = 20}})
                      .ok());
    }
    auto got = drain(scheduler);
    if (tokens == 0) {
      plain = got;
      continue;
    }
    EXPECT_EQ(got, plain);
    std::printf("sampled: drafted %ld, accepted %ld\n", long(scheduler.draftedTokens()),
                long(scheduler.acceptedTokens()));
    EXPECT_GT(scheduler.draftedTokens(), 0);
    EXPECT_EQ(scheduler.freeBlocks(), 96);
  }
}

// Prompt log-probabilities: every prompt token from the second on, scored given those
// before it, as decoding the prompt one token at a time gives them; computed whole even
// where the prefix cache holds the prompt, in chunks, and for a reserved prefill too.
TEST_F(SchedulerTest, PromptLogprobsScoreEachTokenAsOneAtATime) {
  const std::vector<uint32_t> prompt = randomPrompt(150);  // Past kPromptLogprobRows.
  // Reference: the prompt fed one token at a time.
  std::vector<SampledToken> want;
  {
    LlamaRunner runner(*weights_, pool_, 256);
    for (size_t i = 0; i + 1 < prompt.size(); ++i) {
      auto logits = runner.forward(std::span<const uint32_t>(&prompt[i], 1));
      ASSERT_TRUE(logits.ok());
      want.push_back(scoreToken(*logits, prompt[i + 1], 3));
    }
  }
  const std::vector<uint32_t> first = alone(prompt, 1);
  Scheduler scheduler(withBlocks(96), nullptr, {.max_batch_tokens = 100, .max_sequences = 4});
  // The prompt once plainly: its blocks are cached after.
  ASSERT_TRUE(scheduler.add({.id = 1, .prompt = prompt, .stop = {.max_new_tokens = 1}}).ok());
  drain(scheduler);
  auto check = [&](const TokenEvent& e) {
    EXPECT_EQ(e.token, first[0]);
    EXPECT_EQ(e.cached_tokens, 0);
    ASSERT_EQ(e.prompt_logprobs.size(), prompt.size() - 1);
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const SampledToken& got = e.prompt_logprobs[i];
      EXPECT_EQ(got.token, prompt[i + 1]);
      worst = std::max(worst, double(std::fabs(got.logprob - want[i].logprob)));
      ASSERT_EQ(got.top.size(), 3u);
      for (size_t k = 0; k < 3; ++k) EXPECT_EQ(got.top[k].first, want[i].top[k].first) << i;
    }
    EXPECT_LE(worst, 1e-4);
  };
  GenerationRequest scored{
      .id = 2, .prompt = prompt, .stop = {.max_new_tokens = 1}, .prompt_logprobs = 3};
  ASSERT_TRUE(scheduler.add(scored).ok());
  std::vector<TokenEvent> out = events(scheduler);
  ASSERT_EQ(out.size(), 1u);
  check(out[0]);
  // Prefilled into a reservation (a prefill worker's).
  scored.id = 3;
  ASSERT_TRUE(scheduler.reserve(3, 38).ok());  // ceil(150 / 4)
  ASSERT_TRUE(scheduler.addPrefill(scored).ok());
  out = events(scheduler);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].prefilled);
  check(out[0]);
  EXPECT_TRUE(out[0].finished);  // Its only token: the reservation ended with it.
  EXPECT_EQ(scheduler.freeBlocks(), 96);
  // Two at once share the step's scored rows.
  for (uint64_t id : {4, 5}) {
    scored.id = id;
    ASSERT_TRUE(scheduler.add(scored).ok());
  }
  out.clear();
  while (!scheduler.idle()) {
    auto step = scheduler.step();
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_LE(scheduler.lastStepWork().tokens, kPromptLogprobRows);
    out.insert(out.end(), step->begin(), step->end());
  }
  ASSERT_EQ(out.size(), 2u);
  for (const TokenEvent& e : out) check(e);
  scored.prompt_logprobs = kMaxLogprobs + 1;
  EXPECT_THAT(scheduler.add(scored).message(), HasSubstr("prompt_logprobs"));
}

// A reservation that starts with cached blocks of one prompt is refused to a prefill or a
// decode that would write over them: another prompt, a scored prompt (computed whole), a
// shorter prompt decoding into them. A refusal leaves the reservation's blocks and the
// prefix-hit counters as they were.
TEST_F(SchedulerTest, CachedBlocksOfAReservationAreNeverWrittenOver) {
  Scheduler scheduler(withBlocks(64), nullptr, {.max_batch_tokens = 64, .max_sequences = 4});
  const std::vector<uint32_t> prompt = randomPrompt(22);  // 5 full blocks reusable.
  ASSERT_TRUE(scheduler.add({.id = 1, .prompt = prompt, .stop = {.max_new_tokens = 2}}).ok());
  drain(scheduler);
  int64_t cached = 0;
  ASSERT_TRUE(scheduler.reserve(2, 7, prompt, &cached).ok());
  ASSERT_EQ(cached, 5);
  const std::vector<uint32_t> other = randomPrompt(22);
  EXPECT_EQ(scheduler.addPrefill({.id = 2, .prompt = other, .stop = {.max_new_tokens = 2}}).code(),
            absl::StatusCode::kFailedPrecondition);
  // A prompt whose first two blocks are cached (request 3's) would take them in place of the
  // reservation's first two, then write over its cached block 2: refused before any block is
  // swapped or any hit counted.
  ASSERT_TRUE(scheduler.add({.id = 3, .prompt = other, .stop = {.max_new_tokens = 1}}).ok());
  drain(scheduler);
  std::vector<uint32_t> mixed = randomPrompt(22);
  std::copy(other.begin(), other.begin() + 8, mixed.begin());
  const std::vector<int32_t> held = scheduler.reservation(2);
  const int64_t hits = scheduler.prefixHitTokens(), lookups = scheduler.prefixLookupTokens();
  EXPECT_EQ(scheduler.addPrefill({.id = 2, .prompt = mixed, .stop = {.max_new_tokens = 2}}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(scheduler.reservation(2), held);
  EXPECT_EQ(scheduler.prefixHitTokens(), hits);
  EXPECT_EQ(scheduler.prefixLookupTokens(), lookups);
  EXPECT_EQ(
      scheduler
          .addPrefill(
              {.id = 2, .prompt = prompt, .stop = {.max_new_tokens = 2}, .prompt_logprobs = 0})
          .code(),
      absl::StatusCode::kFailedPrecondition);
  const std::vector<uint32_t> shorter(prompt.begin(), prompt.begin() + 9);
  EXPECT_EQ(
      scheduler.startDecode({.id = 2, .prompt = shorter, .stop = {.max_new_tokens = 2}}, 1).code(),
      absl::StatusCode::kFailedPrecondition);
  // Its own prompt is fine.
  ASSERT_TRUE(
      scheduler.addPrefill({.id = 2, .prompt = prompt, .stop = {.max_new_tokens = 2}}).ok());
  drain(scheduler);
  EXPECT_EQ(scheduler.release(2), 7);
  EXPECT_EQ(scheduler.freeBlocks(), 64);
}

// logit_bias, allowed_token_ids and min_new_tokens change what greedy decoding picks as the
// adjusted logits say; bad values are refused naming the field.
TEST_F(SchedulerTest, LogitAdjustmentsSteerTheDraws) {
  Scheduler scheduler(withBlocks(64), nullptr, {.max_batch_tokens = 64, .max_sequences = 8});
  const std::vector<uint32_t> prompt = randomPrompt(9);
  const std::vector<uint32_t> greedy = alone(prompt, 6);
  // A large bias makes one token every draw; a ban moves the first draw off greedy's.
  GenerationRequest forced{.id = 1, .prompt = prompt, .stop = {.max_new_tokens = 4}};
  forced.adjustments.bias = {{7, kMaxLogitBias}};
  GenerationRequest banned{.id = 2, .prompt = prompt, .stop = {.max_new_tokens = 1}};
  banned.adjustments.bias = {{greedy[0], -kMaxLogitBias}};
  GenerationRequest allowed{.id = 3, .prompt = prompt, .stop = {.max_new_tokens = 6}};
  allowed.adjustments.allowed = {11, 12, 13};
  // The second greedy token stops the sequence, but not before four tokens.
  GenerationRequest held{
      .id = 4,
      .prompt = prompt,
      .stop = {.stop_token_ids = {greedy[1]}, .max_new_tokens = 6, .min_new_tokens = 4}};
  for (GenerationRequest* r : {&forced, &banned, &allowed, &held})
    ASSERT_TRUE(scheduler.add(*r).ok());
  auto got = drain(scheduler);
  EXPECT_EQ(got[1], std::vector<uint32_t>(4, 7));
  ASSERT_EQ(got[2].size(), 1u);
  EXPECT_NE(got[2][0], greedy[0]);
  EXPECT_EQ(got[3].size(), 6u);
  for (uint32_t t : got[3]) EXPECT_TRUE(t >= 11 && t <= 13) << t;
  ASSERT_GE(got[4].size(), 4u);
  EXPECT_EQ(got[4][0], greedy[0]);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(got[4][i], greedy[1]) << i;
  EXPECT_EQ(scheduler.freeBlocks(), 64);

  GenerationRequest bad{.id = 5, .prompt = prompt, .stop = {.max_new_tokens = 4}};
  bad.adjustments.bias = {{weights_->config.vocab_size, 1.0f}};
  EXPECT_THAT(scheduler.add(bad).message(), HasSubstr("logit_bias"));
  bad.adjustments = {};
  bad.stop.min_new_tokens = 5;
  EXPECT_THAT(scheduler.add(bad).message(), HasSubstr("min_new_tokens"));
}

// Banned sequences: greedy's first two tokens as a sequence keep its second token from
// following its first (the first is still drawn); a one-token ban of greedy's first moves the
// first draw; a moved sequence (its first token now in the prompt) is still banned from
// completing the sequence; a ban that would leave no token (it takes the only allowed one)
// is dropped rather than drawing from nothing.
TEST_F(SchedulerTest, BannedSequencesAreNeverCompleted) {
  Scheduler scheduler(withBlocks(64), nullptr, {.max_batch_tokens = 64, .max_sequences = 8});
  const std::vector<uint32_t> prompt = randomPrompt(9);
  const std::vector<uint32_t> greedy = alone(prompt, 4);
  ASSERT_NE(greedy[0], greedy[1]);
  GenerationRequest pair{.id = 1, .prompt = prompt, .stop = {.max_new_tokens = 2}};
  pair.adjustments.banned = {{greedy[0], greedy[1]}};
  GenerationRequest single{.id = 2, .prompt = prompt, .stop = {.max_new_tokens = 1}};
  single.adjustments.banned = {{greedy[0]}};
  std::vector<uint32_t> moved_prompt = prompt;
  moved_prompt.push_back(greedy[0]);
  GenerationRequest moved{.id = 3, .prompt = moved_prompt, .stop = {.max_new_tokens = 1}};
  moved.adjustments.banned = {{greedy[0], greedy[1]}};
  moved.output_in_prompt = 1;
  GenerationRequest only{.id = 4, .prompt = prompt, .stop = {.max_new_tokens = 2}};
  only.adjustments.allowed = {5};
  only.adjustments.banned = {{5}};
  for (GenerationRequest* r : {&pair, &single, &moved, &only}) ASSERT_TRUE(scheduler.add(*r).ok());
  auto got = drain(scheduler);
  ASSERT_EQ(got[1].size(), 2u);
  EXPECT_EQ(got[1][0], greedy[0]);
  EXPECT_NE(got[1][1], greedy[1]);
  ASSERT_EQ(got[2].size(), 1u);
  EXPECT_NE(got[2][0], greedy[0]);
  ASSERT_EQ(got[3].size(), 1u);
  EXPECT_NE(got[3][0], greedy[1]);
  EXPECT_EQ(got[4], std::vector<uint32_t>(2, 5));
  EXPECT_EQ(scheduler.freeBlocks(), 64);
}

// SmolLM2's (a byte-level vocabulary) greedy reply to `question` with `constrain` applied
// to the request, which must end with end-of-sequence within 96 tokens; a sequence moved
// mid-reply (its first tokens now in the prompt) must continue with the same tokens, the
// constraint replaying what was already said, and one without an end token is refused.
// Empty when SmolLM2 is missing.
std::string constrainedReply(const std::string& question,
                             const std::function<void(GenerationRequest&)>& constrain) {
  const std::string model = std::string(CLEAVE_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(model)) return "";
  auto tokenizer = tokenizer::Tokenizer::load(model);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto group = TpGroup::load(model, {.tp = 1, .threads = 2});
  EXPECT_TRUE(group.ok()) << group.status();
  if (!tokenizer.ok() || !group.ok()) return "";
  EXPECT_TRUE((*group)->allocateKv(64, 16).ok());
  Scheduler scheduler(**group, tokenizer->get(), {.max_batch_tokens = 256, .max_sequences = 4});
  const std::vector<uint32_t> prompt =
      (*tokenizer)
          ->encode(
              "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
              "Face<|im_end|>\n<|im_start|>user\n" +
                  question + "<|im_end|>\n<|im_start|>assistant\n",
              {.add_special_tokens = false, .parse_special = true});
  const uint32_t eos = *(*tokenizer)->eosId();
  auto run = [&](GenerationRequest request) {
    std::vector<uint32_t> out;
    EXPECT_TRUE(scheduler.add(request).ok());
    while (!scheduler.idle()) {
      auto events = scheduler.step();
      EXPECT_TRUE(events.ok()) << events.status();
      if (!events.ok()) break;
      for (const TokenEvent& e : *events) out.push_back(e.token);
    }
    return out;
  };
  GenerationRequest request{
      .id = 1, .prompt = prompt, .stop = {.stop_token_ids = {eos}, .max_new_tokens = 96}};
  constrain(request);
  const std::vector<uint32_t> reply = run(request);
  if (reply.empty() || reply.back() != eos) {
    ADD_FAILURE() << "the reply did not end within 96 tokens: "
                  << (*tokenizer)->decode(reply, true);
    return "";
  }
  const size_t said = reply.size() / 2;
  GenerationRequest moved = request;
  moved.id = 2;
  moved.prompt.insert(moved.prompt.end(), reply.begin(), reply.begin() + said);
  moved.output_in_prompt = static_cast<int64_t>(said);
  moved.stop.max_new_tokens = 96 - static_cast<int64_t>(said);
  EXPECT_EQ(run(moved), std::vector<uint32_t>(reply.begin() + said, reply.end()));
  GenerationRequest endless = request;
  endless.stop.stop_token_ids.clear();
  EXPECT_EQ(scheduler.add(endless).code(), absl::StatusCode::kInvalidArgument);
  return (*tokenizer)->decode(std::span<const uint32_t>(reply).first(reply.size() - 1), true);
}

TEST(SchedulerConstraintTest, JsonObjectRepliesParseAndMovedSequencesContinueThem) {
  const std::string text = constrainedReply("Describe a cat as a JSON object with name and age.",
                                            [](GenerationRequest& r) { r.json_object = true; });
  if (text.empty() && !HasFailure()) GTEST_SKIP() << "SmolLM2 missing";
  EXPECT_TRUE(nlohmann::json::parse(text, nullptr, false).is_object()) << text;
}

TEST(SchedulerConstraintTest, RegexRepliesMatchAndMovedSequencesContinueThem) {
  const char* pattern = R"((19|20)\d{2}-(0[1-9]|1[0-2])-[0-3]\d, [A-Z][a-z]{2,12}\.)";
  std::shared_ptr<const Regex> regex = *Regex::compile(pattern);
  const std::string text = constrainedReply("When and where did Apollo 11 land?",
                                            [&](GenerationRequest& r) { r.regex = regex; });
  if (text.empty() && !HasFailure()) GTEST_SKIP() << "SmolLM2 missing";
  EXPECT_TRUE(regex->fullMatch(text)) << text;
}

}  // namespace
}  // namespace cleave::engine
