// Latency of the CPU tensor-parallel collectives (Gloo over loopback TCP between rank
// threads of one process): the all-reduce of one token's hidden state, as every layer of a
// decode step issues twice, and a larger one as prefill does.
//
// Run: build/default/bin/bench_collectives [--ranks N] [--iters I]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common/process_init.h"
#include "services/engine/gloo_communicator.h"

int main(int argc, char** argv) {
  cleave::initProcess();  // As the servers run.
  int ranks = 2, iters = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--ranks")) ranks = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
  }
  std::printf("%-28s %14s\n", "all-reduce (floats)", "median (us)");
  for (int floats : {576, 576 * 16, 576 * 512}) {
    cleave::engine::GlooRendezvous rendezvous(ranks);
    std::vector<std::vector<double>> times(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        auto comm = rendezvous.connect(r);
        if (!comm.ok()) std::abort();
        std::vector<float> data(floats, 1.0f);
        for (int i = 0; i < iters / (floats > 10000 ? 20 : 1); ++i) {
          auto start = std::chrono::steady_clock::now();
          if (!(*comm)->allReduceSum(data).ok()) std::abort();
          times[r].push_back(
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                  .count());
        }
      });
    }
    for (std::thread& t : threads) t.join();
    std::sort(times[0].begin(), times[0].end());
    std::printf("%-28d %14.1f\n", floats, times[0][times[0].size() / 2]);
  }
  return 0;
}
