#include "services/router/prefix_index.h"

#include <algorithm>

#include "services/engine/kv_block_pool.h"

namespace cleave::router {

std::vector<uint64_t> PrefixIndex::blockHashes(std::span<const uint32_t> prompt, int64_t block_size,
                                               uint64_t root) {
  std::vector<uint64_t> hashes;
  if (block_size < 1 || prompt.empty()) return hashes;
  const int64_t reusable = (static_cast<int64_t>(prompt.size()) - 1) / block_size;
  uint64_t chain = root;
  for (int64_t j = 0; j < reusable; ++j) {
    chain = engine::KvBlockPool::chainHash(chain, prompt.subspan(j * block_size, block_size));
    hashes.push_back(chain);
  }
  return hashes;
}

int64_t PrefixIndex::matched(const std::string& worker, std::span<const uint64_t> hashes) const {
  auto it = workers_.find(worker);
  if (it == workers_.end()) return 0;
  int64_t n = 0;
  while (n < static_cast<int64_t>(hashes.size()) && it->second.where.contains(hashes[n])) ++n;
  return n;
}

void PrefixIndex::record(const std::string& worker, std::span<const uint64_t> hashes,
                         int64_t capacity) {
  Blocks& blocks = workers_[worker];
  // Last block first, as the worker's pool frees them: the head ends most recent.
  for (auto h = hashes.rbegin(); h != hashes.rend(); ++h) {
    if (auto at = blocks.where.find(*h); at != blocks.where.end()) {
      blocks.lru.splice(blocks.lru.end(), blocks.lru, at->second);
    } else {
      blocks.where.emplace(*h, blocks.lru.insert(blocks.lru.end(), *h));
    }
  }
  while (static_cast<int64_t>(blocks.lru.size()) > std::max<int64_t>(capacity, 0)) {
    blocks.where.erase(blocks.lru.front());
    blocks.lru.pop_front();
  }
}

}  // namespace cleave::router
