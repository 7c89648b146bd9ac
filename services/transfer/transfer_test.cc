#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "services/transfer/kv_transport.h"

namespace cleave::transfer {
namespace {

using ::testing::HasSubstr;

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<KvTransport> make() {
    if (GetParam() == "loopback") return makeLoopbackTransport();
    auto ucx = makeUcxTransport();
    EXPECT_TRUE(ucx.ok()) << ucx.status();
    return ucx.ok() ? std::move(*ucx) : nullptr;
  }
  // `region`, registered with `target` for writes, as writers name it.
  static RemoteRegion exposed(KvTransport& target, std::vector<uint8_t>& region) {
    auto key = target.registerMemory(region.data(), region.size());
    EXPECT_TRUE(key.ok()) << key.status();
    return {.peer_address = target.address(),
            .base = reinterpret_cast<uint64_t>(region.data()),
            .key = key.ok() ? *key : std::string(),
            .bytes = region.size()};
  }
};

// Scattered writes of random bytes land exactly where they were aimed, nothing else moves.
TEST_P(TransportTest, WritesLandWhereTheyAreAimed) {
  auto writer = make(), target = make();
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(target, nullptr);
  std::vector<uint8_t> region(1 << 20, 0xAB);  // Poisoned.
  std::mt19937 rng(3);
  std::vector<uint8_t> source(300000);
  for (auto& b : source) b = static_cast<uint8_t>(rng());
  // Awkward sizes and offsets, one write at the very end of the region.
  const std::vector<Write> writes = {{source.data(), 17, 4093},
                                     {source.data() + 5000, 70001, 123456},
                                     {source.data() + 200000, region.size() - 999, 999}};
  const RemoteRegion remote = exposed(*target, region);
  absl::Status written = writeAndWait(*writer, remote, writes, std::chrono::seconds(10));
  ASSERT_TRUE(written.ok()) << written;
  std::vector<uint8_t> want(region.size(), 0xAB);
  for (const Write& w : writes) {
    std::memcpy(want.data() + w.remote_offset, w.local, w.bytes);
  }
  EXPECT_TRUE(region == want);

  // A write past the region is refused before anything moves.
  const Write outside{source.data(), region.size() - 10, 11};
  auto refused = writer->post(remote, {&outside, 1});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(region == want);
}

// A transfer given up on stops: polled, it reports so; the peer, reconnected, takes the next
// transfer; and nothing of the abandoned one lands over the next one's bytes afterwards.
TEST_P(TransportTest, AnAbandonedTransferStopsAndThePeerIsWrittenAgain) {
  auto writer = make(), target = make();
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(target, nullptr);
  const size_t bytes = size_t{32} << 20;
  std::vector<uint8_t> region(bytes, 0xAB);
  std::vector<uint8_t> first(bytes, 0x11), second(1 << 20, 0x22);
  const RemoteRegion remote = exposed(*target, region);
  const Write big{first.data(), 0, bytes};
  auto abandoned = writer->post(remote, {&big, 1});
  ASSERT_TRUE(abandoned.ok()) << abandoned.status();
  writer->abandon(**abandoned);
  if (GetParam() == "ucx") {
    absl::StatusOr<bool> polled = writer->poll(**abandoned);
    EXPECT_EQ(polled.status().code(), absl::StatusCode::kCancelled) << polled.status();
  }
  const Write small{second.data(), 0, second.size()};
  absl::Status written = writeAndWait(*writer, remote, {&small, 1}, std::chrono::seconds(10));
  ASSERT_TRUE(written.ok()) << written;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(std::equal(second.begin(), second.end(), region.begin()));
}

// A transfer told to stop while unfinished is abandoned (Aborted): nothing of it lands after
// writeAndWait returns (the loopback transport's writes land within post(): done at once);
// one not told to stop completes.
TEST_P(TransportTest, AStoppedTransferIsAbandoned) {
  auto writer = make(), target = make();
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(target, nullptr);
  const size_t bytes = size_t{32} << 20;
  std::vector<uint8_t> region(bytes, 0xAB);
  std::vector<uint8_t> source(bytes, 0x11);
  const RemoteRegion remote = exposed(*target, region);
  const Write big{source.data(), 0, bytes};
  absl::Status stopped =
      writeAndWait(*writer, remote, {&big, 1}, std::chrono::seconds(10), [] { return true; });
  if (GetParam() == "loopback") {
    EXPECT_TRUE(stopped.ok()) << stopped;
  } else {
    EXPECT_TRUE(stopped.code() == absl::StatusCode::kAborted || stopped.ok()) << stopped;
  }
  // Whatever had moved before the stop, nothing moves after it.
  const std::vector<uint8_t> after_stop = region;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(region == after_stop);
  absl::Status written =
      writeAndWait(*writer, remote, {&big, 1}, std::chrono::seconds(10), [] { return false; });
  ASSERT_TRUE(written.ok()) << written;
  EXPECT_TRUE(region == source);
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportTest, ::testing::Values("loopback", "ucx"));

}  // namespace
}  // namespace cleave::transfer
