#include "common/service_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>

namespace cleave {
namespace {

using namespace std::chrono_literals;

TEST(ServiceThreadTest, RunsUntilStoppedAndStopInterruptsSleep) {
  ServiceThread thread("test-loop");
  std::atomic<int> iterations{0};
  std::promise<void> first;
  std::atomic<bool> woke_by_stop{false};
  thread.start([&](std::stop_token token) {
    while (!token.stop_requested()) {
      if (iterations.fetch_add(1) == 0) first.set_value();
      // A long sleep: stop() must cut it short or the test times out.
      if (!sleepFor(token, 1h)) woke_by_stop = true;
    }
  });
  ASSERT_EQ(first.get_future().wait_for(30s), std::future_status::ready);
  EXPECT_TRUE(thread.running());
  thread.stop();
  EXPECT_FALSE(thread.running());
  EXPECT_TRUE(woke_by_stop);
  EXPECT_EQ(iterations.load(), 1);
  thread.stop();  // Idempotent.
}

TEST(ServiceThreadTest, SleepForReturnsTrueWhenTheTimeElapses) {
  std::stop_source source;
  EXPECT_TRUE(sleepFor(source.get_token(), 1ms));
  source.request_stop();
  EXPECT_FALSE(sleepFor(source.get_token(), 1h));
}

}  // namespace
}  // namespace cleave
