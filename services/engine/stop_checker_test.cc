#include "services/engine/stop_checker.h"

#include <gtest/gtest.h>

namespace cleave::engine {
namespace {

TEST(StopCheckerTest, StopStringAcrossTokensIsNeverShown) {
  StopChecker checker({.stop_strings = {"\nUser:"}});
  std::string shown;
  shown += checker.push(1, "Hello");
  shown += checker.push(2, " there\n");
  EXPECT_EQ(shown, "Hello there");  // "\n" might start the stop string: held.
  shown += checker.push(3, "Us");
  EXPECT_FALSE(checker.stopped());
  shown += checker.push(4, "er: hi");
  EXPECT_TRUE(checker.stopped());
  EXPECT_EQ(checker.reason(), StopReason::kStopString);
  EXPECT_EQ(checker.matched(), "\nUser:");
  EXPECT_EQ(shown, "Hello there");
  EXPECT_EQ(checker.push(5, "more"), "");  // Nothing after the stop.
}

TEST(StopCheckerTest, HeldTextThatTurnsOutHarmlessIsShown) {
  StopChecker checker({.stop_strings = {"END"}});
  EXPECT_EQ(checker.push(1, "the EN"), "the ");
  EXPECT_EQ(checker.push(2, "D"), "");
  EXPECT_TRUE(checker.stopped());
  StopChecker other({.stop_strings = {"END"}});
  EXPECT_EQ(other.push(1, "the EN"), "the ");
  EXPECT_EQ(other.push(2, "ough"), "ENough");
  EXPECT_FALSE(other.stopped());
}

TEST(StopCheckerTest, StopTokensAndTheLimit) {
  StopChecker tokens({.stop_token_ids = {2, 7}});
  EXPECT_EQ(tokens.push(5, "a"), "a");
  EXPECT_EQ(tokens.push(7, "<eos>"), "");
  EXPECT_EQ(tokens.reason(), StopReason::kStopToken);
  EXPECT_EQ(tokens.matched(), "7");
  StopChecker limit({.stop_strings = {"xyz"}, .max_new_tokens = 2});
  EXPECT_EQ(limit.push(1, "ab"), "ab");
  EXPECT_EQ(limit.push(1, "cx"), "cx");  // Held "x" is released when the limit ends it.
  EXPECT_EQ(limit.reason(), StopReason::kLength);
}

// Before min_new_tokens neither a stop token nor a stop string ends the sequence (its text
// is shown); from then on both do.
TEST(StopCheckerTest, NothingStopsBeforeTheMinimum) {
  StopChecker early(
      {.stop_token_ids = {7}, .stop_strings = {"END"}, .max_new_tokens = 10, .min_new_tokens = 3});
  EXPECT_EQ(early.push(7, "<eos>"), "<eos>");
  EXPECT_EQ(early.push(5, "END."), "END.");
  EXPECT_FALSE(early.stopped());
  EXPECT_EQ(early.push(5, "xEN"), "x");  // The third: a stop string may end it now.
  EXPECT_EQ(early.push(5, "D!"), "");
  EXPECT_EQ(early.reason(), StopReason::kStopString);
  StopChecker token({.stop_token_ids = {7}, .max_new_tokens = 10, .min_new_tokens = 2});
  token.push(7, "");
  EXPECT_FALSE(token.stopped());
  token.push(7, "");
  EXPECT_EQ(token.reason(), StopReason::kStopToken);
}

}  // namespace
}  // namespace cleave::engine
