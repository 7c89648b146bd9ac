#include "common/log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace cleave::log {
namespace {

TEST(LogTest, ParsesLevels) {
  EXPECT_EQ(*parseLevel("DEBUG"), Level::kDebug);
  EXPECT_EQ(*parseLevel("warn"), Level::kWarning);
  EXPECT_FALSE(parseLevel("verbose").ok());
}

TEST(LogTest, MessagesBelowTheLevelAreNotEvaluated) {
  Level saved = minLevel();
  setMinLevel(Level::kWarning);
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  CLEAVE_LOG(INFO) << count();
  EXPECT_EQ(evaluated, 0);
  testing::internal::CaptureStderr();
  CLEAVE_LOG(ERROR) << "value " << count();
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(evaluated, 1);
  EXPECT_THAT(err,
              testing::MatchesRegex("E[0-9]{4} [0-9:.]+ [0-9]+ log_test.cc:[0-9]+\\] value 1\n"));
  setMinLevel(saved);
}

TEST(LogDeathTest, FailedCheckAbortsWithTheCondition) {
  int blocks = 3;
  EXPECT_DEATH(CLEAVE_CHECK(blocks < 2) << "blocks=" << blocks,
               "Check failed: blocks < 2 blocks=3");
  CLEAVE_CHECK(blocks == 3);  // Passing checks do nothing.
}

TEST(LogDeathTest, CheckOkPrintsTheStatus) {
  EXPECT_DEATH(CLEAVE_CHECK_OK(absl::NotFoundError("no such block")), "no such block");
}

}  // namespace
}  // namespace cleave::log
