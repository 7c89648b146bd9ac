// The router's guess at what each prefill worker holds in its prefix cache: the blocks of
// the prompts it sent there, the least recently sent dropped past the worker's pool size.
// Only a guess (a worker evicts on its own terms, and its pool also holds the prompts it is
// computing): a wrong one costs a recomputation, never a wrong result, since the worker
// looks every block up itself.
//
// Blocks are named by the engine's hash chain (KvBlockPool::chainHash) over the prompt's
// full blocks that a cache may supply: all but the one holding the last token, which is
// always computed.
//
// Threading: not synchronized (the worker pool uses it under its lock).
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace cleave::router {

class PrefixIndex {
 public:
  // The hash chain of the blocks of `prompt` a cache may supply.
  static std::vector<uint64_t> blockHashes(std::span<const uint32_t> prompt, int64_t block_size,
                                           uint64_t root = 0);

  // How many of `hashes`, from the first, `worker` holds.
  int64_t matched(const std::string& worker, std::span<const uint64_t> hashes) const;
  // `worker` holds `hashes` now (the most recent); it keeps at most `capacity` blocks.
  void record(const std::string& worker, std::span<const uint64_t> hashes, int64_t capacity);
  // `worker` holds nothing (it left, or registered again with an empty cache).
  void forget(const std::string& worker) { workers_.erase(worker); }

 private:
  struct Blocks {
    std::list<uint64_t> lru;  // Least recently sent first.
    std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where;
  };
  std::unordered_map<std::string, Blocks> workers_;
};

}  // namespace cleave::router
