// NCCL collectives across every visible GPU (one rank thread each), against sums computed
// on the host. With one GPU the group has one rank and NCCL still runs every call.
#include "services/engine/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cuda/cuda_test_util.h"

namespace cleave::engine {
namespace {

TEST(NcclCommunicatorTest, AllReduceAllGatherBroadcastOnEveryGpu) {
  CLEAVE_REQUIRE_GPU();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  std::vector<int> devices(count);
  for (int i = 0; i < count; ++i) devices[i] = i;
  auto group = NcclCommunicator::createGroup(devices);
  ASSERT_TRUE(group.ok()) << group.status();
  std::mt19937 rng(cuda::testing::freshSeed());
  std::uniform_real_distribution<float> dist(-1, 1);
  const int64_t n = 4099;
  std::vector<std::vector<float>> inputs(count, std::vector<float>(n));
  for (auto& v : inputs)
    for (float& x : v) x = dist(rng);
  std::vector<int64_t> counts(count);
  for (int r = 0; r < count; ++r) counts[r] = 100 + 37 * r;  // Uneven.
  std::vector<float> want_sum(n, 0.0f), want_gather;
  for (int r = 0; r < count; ++r) {
    for (int64_t i = 0; i < n; ++i) want_sum[i] += inputs[r][i];
    want_gather.insert(want_gather.end(), inputs[r].begin(), inputs[r].begin() + counts[r]);
  }
  std::vector<std::string> failures(count);
  std::vector<std::thread> threads;
  for (int r = 0; r < count; ++r) {
    threads.emplace_back([&, r] {
      NcclCommunicator& c = *(*group)[r];
      cudaSetDevice(c.device());
      cuda::testing::DeviceBuffer<float> data(inputs[r]), gathered(want_gather.size());
      cuda::testing::DeviceBuffer<float> mine(
          std::vector<float>(inputs[r].begin(), inputs[r].begin() + counts[r]));
      if (auto s = c.allReduceSum({data.get(), static_cast<size_t>(n)}); !s.ok())
        failures[r] = s.ToString();
      std::vector<float> sum = data.copyToHost();
      for (int64_t i = 0; i < n; ++i)
        if (std::abs(sum[i] - want_sum[i]) > 1e-5f) failures[r] = "all-reduce differs";
      if (auto s = c.allGather({mine.get(), static_cast<size_t>(counts[r])}, counts,
                               {gathered.get(), want_gather.size()});
          !s.ok())
        failures[r] = s.ToString();
      if (gathered.copyToHost() != want_gather) failures[r] = "all-gather differs";
      if (auto s =
              c.broadcast({reinterpret_cast<std::byte*>(data.get()), n * sizeof(float)}, count - 1);
          !s.ok())
        failures[r] = s.ToString();
      if (auto s = c.barrier(); !s.ok()) failures[r] = s.ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < count; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

TEST(NcclCommunicatorTest, RefusesBadGroups) {
  EXPECT_FALSE(NcclCommunicator::createGroup({}).ok());
  EXPECT_FALSE(NcclCommunicator::createGroup({0, 0}).ok());
}

}  // namespace
}  // namespace cleave::engine
