// KV transfer between two processes over UCX, as a prefill worker hands a prompt to a
// decode worker: the KV cache of one 4096-token request of SmolLM2's shape (30 layers,
// 3 KV heads of 64, f32, blocks of 16 positions: one write per layer, K/V and block, 12 KiB
// each, 180 MiB in all) written into a pool another process registered. Printed next to a
// plain memcpy of the same bytes measured in the same run.
//
// Run: build/default/bin/bench_kv_transfer [--tokens N] [--reps R]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/process_init.h"
#include "services/transfer/kv_transport.h"

namespace {

using Clock = std::chrono::steady_clock;
using cleave::transfer::Write;

constexpr int64_t kLayers = 30, kHeads = 3, kHeadDim = 64, kBlock = 16;
constexpr int64_t kSegment = kHeads * kBlock * kHeadDim * 4;  // One layer's K (or V) of a block.

bool writeAll(int fd, const std::string& s) {
  uint64_t n = s.size();
  return write(fd, &n, 8) == 8 && write(fd, s.data(), n) == static_cast<ssize_t>(n);
}
std::string readAll(int fd) {
  uint64_t n = 0;
  if (read(fd, &n, 8) != 8) return "";
  std::string s(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, s.data() + got, n - got);
    if (r <= 0) return "";
    got += static_cast<size_t>(r);
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  cleave::initProcess();  // As the servers run.
  int64_t tokens = 4096;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  const int64_t blocks = (tokens + kBlock - 1) / kBlock;
  const uint64_t bytes = static_cast<uint64_t>(2 * kLayers * blocks * kSegment);
  int to_parent[2], to_child[2];
  if (pipe(to_parent) != 0 || pipe(to_child) != 0) return 1;
  pid_t child = fork();
  if (child == 0) {  // The decode side: registers its pool and waits.
    close(to_child[1]);
    close(to_parent[0]);
    auto transport = cleave::transfer::makeUcxTransport();
    if (!transport.ok()) return 2;
    std::vector<uint8_t> pool(bytes);
    auto key = (*transport)->registerMemory(pool.data(), bytes);
    if (!key.ok()) return 3;
    writeAll(to_parent[1], (*transport)->address());
    writeAll(to_parent[1], *key);
    writeAll(to_parent[1], std::to_string(reinterpret_cast<uint64_t>(pool.data())));
    char done;
    while (read(to_child[0], &done, 1) > 0) {
    }
    return 0;
  }
  close(to_child[0]);
  close(to_parent[1]);
  const std::string address = readAll(to_parent[0]);
  const std::string key = readAll(to_parent[0]);
  const uint64_t base = std::stoull(readAll(to_parent[0]));
  auto transport = cleave::transfer::makeUcxTransport();
  if (!transport.ok()) {
    std::fprintf(stderr, "bench_kv_transfer: %s\n",
                 std::string(transport.status().message()).c_str());
    return 1;
  }
  std::vector<uint8_t> source(bytes), copy(bytes);
  for (uint64_t i = 0; i < bytes; i += 4096) source[i] = static_cast<uint8_t>(i >> 12);
  // Scattered destination blocks, as a reservation hands them out.
  std::vector<Write> writes;
  for (int64_t layer = 0; layer < kLayers; ++layer)
    for (int64_t kv = 0; kv < 2; ++kv)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t at = (layer * 2 + kv) * blocks + b;
        const int64_t target = (layer * 2 + kv) * blocks + (b * 7919) % blocks;
        writes.push_back({source.data() + at * kSegment, static_cast<uint64_t>(target * kSegment),
                          static_cast<uint64_t>(kSegment)});
      }
  cleave::transfer::RemoteRegion region{
      .peer_address = address, .base = base, .key = key, .bytes = bytes};
  std::vector<double> ucx, local;
  for (int r = 0; r < reps + 1; ++r) {
    auto start = Clock::now();
    absl::Status done =
        cleave::transfer::writeAndWait(**transport, region, writes, std::chrono::seconds(60));
    const double t = std::chrono::duration<double>(Clock::now() - start).count();
    if (!done.ok()) {
      std::fprintf(stderr, "bench_kv_transfer: %s\n", std::string(done.message()).c_str());
      return 1;
    }
    start = Clock::now();
    for (const Write& w : writes) std::memcpy(copy.data() + w.remote_offset, w.local, w.bytes);
    const double m = std::chrono::duration<double>(Clock::now() - start).count();
    if (r > 0) ucx.push_back(t), local.push_back(m);  // r = 0 connects and warms up.
  }
  close(to_child[1]);
  waitpid(child, nullptr, 0);
  std::printf("KV of a %lld-token request: %.1f MiB in %zu writes of %lld KiB\n",
              static_cast<long long>(tokens), bytes / 1048576.0, writes.size(),
              static_cast<long long>(kSegment / 1024));
  std::printf("%-28s %10s %10s\n", "", "ms", "GB/s");
  std::printf("%-28s %10.2f %10.2f\n", "UCX put, process to process", median(ucx) * 1e3,
              bytes / median(ucx) / 1e9);
  std::printf("%-28s %10.2f %10.2f\n", "memcpy, same process", median(local) * 1e3,
              bytes / median(local) / 1e9);
  std::printf("UCX / memcpy: %.2f\n", median(local) / median(ucx));
  return 0;
}
