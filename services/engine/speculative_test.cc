#include "services/engine/speculative.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace cleave::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<uint32_t> propose(std::vector<uint32_t> tokens, NgramOptions options, int64_t count) {
  std::vector<uint32_t> drafts = {99, 99};  // Poisoned: cleared first.
  proposeNgram(tokens, options, count, drafts);
  return drafts;
}

TEST(NgramProposerTest, TheLongestEarlierMatchWinsThenTheMostRecent) {
  // "2 3 4" occurred once (then 8 5 3); its tail "3 4" more recently (then 6).
  EXPECT_THAT(propose({7, 2, 3, 4, 8, 5, 3, 4, 6, 2, 3, 4}, {.min = 1, .max = 4}, 3),
              ElementsAre(8, 5, 3));
  // "1 2" twice: the later one's continuation.
  EXPECT_THAT(propose({1, 2, 5, 1, 2, 6, 1, 2}, {.min = 2, .max = 4}, 2), ElementsAre(6, 1));
  // Capped by count; one token when the match is all there is.
  EXPECT_THAT(propose({1, 2, 5, 1, 2, 6, 1, 2}, {.min = 2, .max = 4}, 1), ElementsAre(6));
}

TEST(NgramProposerTest, ALoopGoesOnPastTheEnd) {
  EXPECT_THAT(propose({4, 4, 4}, {.min = 1, .max = 4}, 3), ElementsAre(4, 4, 4));
  EXPECT_THAT(propose({9, 1, 2, 3, 1, 2, 3}, {.min = 2, .max = 3}, 5), ElementsAre(1, 2, 3, 1, 2));
}

TEST(NgramProposerTest, NothingWithoutAMatchOfTheShortestLength) {
  EXPECT_THAT(propose({1, 2, 5, 9, 2}, {.min = 2, .max = 4}, 3), IsEmpty());
  EXPECT_THAT(propose({1, 2, 5, 9, 2}, {.min = 1, .max = 4}, 3), ElementsAre(5, 9, 2));
  EXPECT_THAT(propose({1, 2, 3, 4}, {.min = 1, .max = 4}, 3), IsEmpty());
  EXPECT_THAT(propose({5}, {.min = 1, .max = 4}, 3), IsEmpty());
  EXPECT_THAT(propose({}, {.min = 1, .max = 4}, 3), IsEmpty());
  EXPECT_THAT(propose({4, 4, 4}, {.min = 1, .max = 4}, 0), IsEmpty());
}

TEST(SpeculativeOptionsTest, FlagsOutOfRangeAreNamed) {
  EXPECT_TRUE(validate({}).ok());
  EXPECT_TRUE(validate({.tokens = 4, .ngram = {.min = 1, .max = 1}}).ok());
  EXPECT_THAT(validate({.tokens = -1}).message(), ::testing::HasSubstr("--speculative-tokens"));
  EXPECT_THAT(validate({.tokens = 17}).message(), ::testing::HasSubstr("--speculative-tokens"));
  EXPECT_THAT(validate({.tokens = 4, .ngram = {.min = 0, .max = 4}}).message(),
              ::testing::HasSubstr("--prompt-lookup-min"));
  EXPECT_THAT(validate({.tokens = 4, .ngram = {.min = 3, .max = 2}}).message(),
              ::testing::HasSubstr("--prompt-lookup-max"));
}

}  // namespace
}  // namespace cleave::engine
