// NCCL collectives across every visible GPU (one rank thread each), against sums computed
// on the host. With one GPU the group has one rank and NCCL still runs every call.
#include "services/engine/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include <functional>
#include <random>
#include <string>
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

// Runs `body(rank)` on one thread per rank and returns the ranks' failures ("" = none).
std::vector<std::string> onEveryRank(int ranks, const std::function<std::string(int)>& body) {
  std::vector<std::string> failures(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back([&, r] { failures[r] = body(r); });
  for (auto& t : threads) t.join();
  return failures;
}

std::vector<int> everyGpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return {};
  std::vector<int> devices(count);
  for (int i = 0; i < count; ++i) devices[i] = i;
  return devices;
}

// The one-shot P2P all-reduce against NCCL's on the same inputs, every size class (one
// float, a chunk boundary, exactly 256 KiB, one float past it: NCCL), ten calls in a row
// (both inbox halves, twice over). Two ranks: a + b is the same either way round, so the
// results must be equal bit for bit; more ranks may round differently (<= 1e-6).
TEST(P2pAllReduceTest, MatchesNccl) {
  CLEAVE_REQUIRE_GPU();
  const std::vector<int> devices = everyGpu();
  if (devices.size() < 2) GTEST_SKIP() << "one GPU: the P2P all-reduce needs two";
  auto p2p = NcclCommunicator::createGroup(devices, true);
  auto nccl = NcclCommunicator::createGroup(devices, false);
  ASSERT_TRUE(p2p.ok() && nccl.ok());
  if (!(*p2p)[0]->p2p()) GTEST_SKIP() << "these GPUs cannot reach each other over P2P";
  const int ranks = static_cast<int>(devices.size());
  std::mt19937 rng(cuda::testing::freshSeed());
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int64_t n : {int64_t{1}, int64_t{4099}, int64_t{65536}, int64_t{65537}}) {
    for (int call = 0; call < 10; ++call) {
      std::vector<std::vector<float>> inputs(ranks, std::vector<float>(n));
      for (auto& v : inputs)
        for (float& x : v) x = dist(rng);
      std::vector<std::vector<float>> got(ranks), want(ranks);
      auto failures = onEveryRank(ranks, [&](int r) -> std::string {
        cudaSetDevice(devices[r]);
        cuda::testing::DeviceBuffer<float> a(inputs[r]), b(inputs[r]);
        if (auto s = (*p2p)[r]->allReduceSum({a.get(), size_t(n)}); !s.ok()) return s.ToString();
        if (auto s = (*nccl)[r]->allReduceSum({b.get(), size_t(n)}); !s.ok()) return s.ToString();
        got[r] = a.copyToHost();
        want[r] = b.copyToHost();
        return "";
      });
      for (int r = 0; r < ranks; ++r) ASSERT_EQ(failures[r], "") << "rank " << r;
      for (int r = 0; r < ranks; ++r) {
        EXPECT_EQ(got[r], got[0]) << "ranks disagree, n " << n;
        for (int64_t i = 0; i < n; ++i) {
          if (ranks == 2) {
            ASSERT_EQ(got[r][i], want[r][i]) << "n " << n << " i " << i;
          } else {
            ASSERT_NEAR(got[r][i], want[r][i], 1e-6f * ranks) << "n " << n << " i " << i;
          }
        }
      }
    }
  }
}

// On any GPU count (one included: the kernel pushes to itself): repeated calls and a CUDA
// graph capturing the collective, replayed with new data each time, keep the call counts
// and inbox halves in step.
TEST(P2pAllReduceTest, RepeatsAndReplaysInAGraph) {
  CLEAVE_REQUIRE_GPU();
  const std::vector<int> devices = everyGpu();
  auto p2p = cuda::P2pAllReduce::create(devices);
  if (!p2p.ok()) GTEST_SKIP() << p2p.status();
  const int ranks = static_cast<int>(devices.size());
  const int64_t n = 3000;
  auto failures = onEveryRank(ranks, [&](int r) -> std::string {
    cudaSetDevice(devices[r]);
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    cuda::testing::DeviceBuffer<float> data(n);
    auto fillAndCheck = [&](int round, auto&& run) -> std::string {
      std::vector<float> mine(n);
      for (int64_t i = 0; i < n; ++i) mine[i] = float(round * 7 + r + 1) * float(i % 13 + 1);
      cudaMemcpy(data.get(), mine.data(), n * 4, cudaMemcpyHostToDevice);
      if (std::string e = run(); !e.empty()) return e;
      cudaStreamSynchronize(stream);
      const std::vector<float> sum = data.copyToHost();
      for (int64_t i = 0; i < n; ++i) {
        float want = 0;
        for (int q = 0; q < ranks; ++q) want += float(round * 7 + q + 1) * float(i % 13 + 1);
        if (sum[i] != want) return "round " + std::to_string(round) + " index " + std::to_string(i);
      }
      return "";
    };
    for (int round = 0; round < 5; ++round) {
      std::string e = fillAndCheck(round, [&] {
        auto s = (*p2p)->run(r, data.get(), n, stream);
        return s.ok() ? std::string() : s.ToString();
      });
      if (!e.empty()) return e;
    }
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    auto captured = (*p2p)->run(r, data.get(), n, stream);
    cudaStreamEndCapture(stream, &graph);
    if (!captured.ok()) return captured.ToString();
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return "instantiate";
    for (int round = 5; round < 9; ++round) {
      std::string e = fillAndCheck(round, [&] {
        return cudaGraphLaunch(exec, stream) == cudaSuccess ? std::string() : "graph launch";
      });
      if (!e.empty()) return e;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    return "";
  });
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

TEST(P2pAllReduceTest, RefusesWhatItCannotTake) {
  EXPECT_FALSE(cuda::P2pAllReduce::create({}).ok());
  EXPECT_FALSE(cuda::P2pAllReduce::create({0, 1, 2, 3, 4, 5, 6, 7, 8}).ok());
  EXPECT_FALSE(cuda::P2pAllReduce::create({0}, 100).ok());
}

TEST(NcclCommunicatorTest, RefusesBadGroups) {
  EXPECT_FALSE(NcclCommunicator::createGroup({}).ok());
  EXPECT_FALSE(NcclCommunicator::createGroup({0, 0}).ok());
}

}  // namespace
}  // namespace cleave::engine
