#include "services/worker/engine_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "common/log.h"
#include "services/engine/tp_group.h"

namespace cleave::worker {
namespace {

const std::string kTinyModel = std::string(CLEAVE_GOLDEN_DIR) + "/engine/hf/llama_f32";

// What the sink last saw, read by the test thread.
struct Seen {
  std::atomic<int64_t> reserved{-1};
  std::atomic<int64_t> decoding{-1};
  std::atomic<int64_t> steps{0};
};

std::unique_ptr<engine::TpGroup> tinyModel(int64_t blocks) {
  auto group = engine::TpGroup::load(kTinyModel, {.tp = 1, .threads = 1});
  CLEAVE_CHECK_OK(group.status());
  CLEAVE_CHECK_OK((*group)->allocateKv(blocks, 4));
  return std::move(*group);
}

// A call returns only after the sink has seen the pool it left, idle or busy: a gauge read
// right after a Reserve or a Release shows it, and the batch still running is not lost.
TEST(EngineLoopTest, ACallReturnsAfterTheSinkSawThePoolItLeft) {
  std::unique_ptr<engine::TpGroup> model = tinyModel(256);
  Seen seen;
  EngineLoop loop(*model, nullptr, {}, [&](StepReport& report) {
    seen.reserved = report.reserved_blocks;
    seen.decoding = report.decode_batch;
    if (!report.stepped) return;
    ++seen.steps;
    // Slow steps: the sequence below decodes for over a second, long past the calls made
    // while it does.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  std::mt19937 rng(11);
  int64_t reserved = 0;
  for (uint64_t id = 1; id <= 6; ++id) {
    const int64_t count = 1 + static_cast<int64_t>(rng() % 5);
    auto blocks = loop.call([&](engine::Scheduler& s) { return s.reserve(id, count); });
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    reserved += count;
    EXPECT_EQ(seen.reserved, reserved) << "after reserving " << id << ", idle";
  }
  // Busy: a long sequence decodes while reservations come and go.
  std::vector<uint32_t> prompt(9);
  for (uint32_t& t : prompt) t = 1 + rng() % 200;
  ASSERT_TRUE(loop.call([&](engine::Scheduler& s) {
                    return s.add({.id = 100, .prompt = prompt, .stop = {.max_new_tokens = 240}});
                  })
                  .ok());
  while (seen.steps < 2) std::this_thread::yield();
  for (uint64_t id = 1; id <= 6; ++id) {
    reserved -= loop.call([&](engine::Scheduler& s) { return s.release(id); });
    // The decoding sequence holds blocks too, but not as a reservation.
    EXPECT_EQ(seen.reserved, reserved) << "after releasing " << id << ", busy";
    EXPECT_EQ(seen.decoding, 1) << "after releasing " << id << ", busy";
  }
  EXPECT_EQ(reserved, 0);
  loop.call([](engine::Scheduler& s) { return s.cancel(100); });
  EXPECT_EQ(seen.decoding, 0) << "idle";
}

}  // namespace
}  // namespace cleave::worker
