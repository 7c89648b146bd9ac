#include "services/worker/kv_staging.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <span>
#include <thread>

namespace cleave::worker {
namespace {

using ::testing::HasSubstr;

TEST(KvStagingSlotsTest, LendsItsOwnRowsLowestFirstAndTakesThemBack) {
  KvStagingSlots slots(10, 5, "the receive staging area");
  auto a = slots.take(2, absl::InfinitePast());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (std::vector<int32_t>{10, 11}));
  auto b = slots.take(3, absl::InfinitePast());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, (std::vector<int32_t>{12, 13, 14}));
  EXPECT_EQ(slots.available(), 0);
  auto none = slots.take(1, absl::InfinitePast());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(none.status().message(), HasSubstr("5 of 5 blocks held"));
  slots.give(*a);
  auto again = slots.take(1, absl::InfinitePast());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, (std::vector<int32_t>{10}));
  EXPECT_EQ(slots.available(), 1);
}

TEST(KvStagingSlotsTest, ReportsItsFreeSlotsOnEveryChange) {
  std::vector<int64_t> seen;
  KvStagingSlots slots(0, 3, "area", [&seen](int64_t free) { seen.push_back(free); });
  auto a = slots.take(2, absl::InfinitePast());
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(slots.take(2, absl::InfinitePast()).ok());  // no change: not reported
  slots.give(*a);
  EXPECT_EQ(seen, (std::vector<int64_t>{3, 1, 3}));
}

TEST(KvStagingSlotsTest, RefusesATransferLargerThanTheArea) {
  KvStagingSlots slots(0, 4, "the send staging area (--kv-staging-tokens)");
  auto big = slots.take(5, absl::InfiniteFuture());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), HasSubstr("--kv-staging-tokens"));
  EXPECT_EQ(slots.available(), 4);
}

TEST(KvStagingSlotsTest, WaitsForSlotsGivenBackOnAnotherThread) {
  KvStagingSlots slots(0, 3, "area");
  auto held = slots.take(3, absl::InfinitePast());
  ASSERT_TRUE(held.ok());
  std::atomic<bool> taken{false};
  std::thread waiter([&] {
    auto got = slots.take(2, absl::Now() + absl::Seconds(30));
    EXPECT_TRUE(got.ok()) << got.status();
    if (got.ok()) EXPECT_EQ(got->size(), 2u);
    taken = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(taken);
  slots.give(std::span<const int32_t>(*held).subspan(0, 2));
  waiter.join();
  EXPECT_TRUE(taken);
  EXPECT_EQ(slots.available(), 0);
}

TEST(KvStagingSlotsTest, AWaitEndsAtItsDeadlineOrWhenCancelled) {
  KvStagingSlots slots(0, 1, "area");
  auto held = slots.take(1, absl::InfinitePast());
  ASSERT_TRUE(held.ok());
  const absl::Time start = absl::Now();
  EXPECT_EQ(slots.take(1, start + absl::Milliseconds(60)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(60));
  int polls = 0;
  auto cancelled = slots.take(1, absl::InfiniteFuture(), [&] { return ++polls > 2; });
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(polls, 3);
}

TEST(PlanStagingTest, SizesEachSideForWhatItMoves) {
  // Context 4096, planned 512, blocks of 16: a whole prompt is 256 blocks.
  StagingSizes both = planStaging(true, true, 0, 4096, 512, 10000, 16);
  EXPECT_EQ(both.send, 256);
  EXPECT_EQ(both.receive, 256);
  // Four planned sequences outgrow one whole-context prompt; the pool caps it.
  EXPECT_EQ(planStaging(false, true, 0, 4096, 2048, 10000, 16).receive, 512);
  EXPECT_EQ(planStaging(false, true, 0, 4096, 2048, 300, 16).receive, 300);
  StagingSizes prefill = planStaging(true, false, 0, 4096, 512, 0, 16);
  EXPECT_EQ(prefill.send, 256);
  EXPECT_EQ(prefill.receive, 0);
  // A send goes a chunk at a time: a long context does not grow it; a short one bounds it.
  EXPECT_EQ(planStaging(true, false, 0, 131072, 512, 0, 16).send, kSendBlocks);
  EXPECT_EQ(planStaging(true, false, 0, 256, 512, 0, 16).send, 16);
  // The flag sets both sides, in tokens rounded up to blocks.
  StagingSizes flagged = planStaging(true, true, 1000, 4096, 512, 10000, 16);
  EXPECT_EQ(flagged.send, 63);
  EXPECT_EQ(flagged.receive, 63);
}

TEST(KvStagingSlotsDeathTest, ASlotGivenTwiceIsCaught) {
  KvStagingSlots slots(0, 2, "area");
  auto taken = slots.take(1, absl::InfinitePast());
  ASSERT_TRUE(taken.ok());
  slots.give(*taken);
  EXPECT_DEATH(slots.give(*taken), "");
}

}  // namespace
}  // namespace cleave::worker
