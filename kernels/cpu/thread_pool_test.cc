#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace cleave::cpu {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t tasks : {0, 1, 3, 97}) {
      std::vector<std::atomic<int>> hits(tasks);
      pool.run(tasks, [&](int64_t t) { hits[t].fetch_add(1); });
      for (int64_t t = 0; t < tasks; ++t) EXPECT_EQ(hits[t].load(), 1) << threads << " " << t;
    }
  }
}

TEST(ThreadPoolTest, ManySmallJobsInARowFinish) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 20000; ++job) pool.run(4, [&](int64_t t) { total.fetch_add(t + 1); });
  EXPECT_EQ(total.load(), 20000 * 10);
}

TEST(ThreadPoolTest, ParallelForCoversTheRangeInAlignedChunks) {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> hits(1003);
  std::atomic<bool> misaligned{false};
  pool.parallelFor(1003, 16, [&](int64_t begin, int64_t end) {
    if (begin % 16 != 0) misaligned = true;
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
  });
  EXPECT_FALSE(misaligned.load());
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

}  // namespace
}  // namespace cleave::cpu
