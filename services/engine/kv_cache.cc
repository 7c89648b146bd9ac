#include "services/engine/kv_cache.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cleave::engine {

KvCache::KvCache(const KvCacheOptions& options) : options_(options) {
  const int64_t floats = options.num_blocks * options.block_size * options.kv_dim;
  keys_.assign(options.num_layers, std::vector<float>(floats));
  values_.assign(options.num_layers, std::vector<float>(floats));
  refcount_.assign(options.num_blocks, 0);
  for (int64_t b = options.num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

absl::StatusOr<std::vector<int32_t>> KvCache::allocate(int64_t count) {
  if (count > freeBlocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache: ", count, " blocks wanted, ",
                                                     freeBlocks(), " of ", totalBlocks(), " free"));
  }
  std::vector<int32_t> blocks(free_.end() - count, free_.end());
  free_.resize(free_.size() - count);
  for (int32_t b : blocks) refcount_[b] = 1;
  return blocks;
}

void KvCache::retain(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    CLEAVE_CHECK(b >= 0 && b < totalBlocks() && refcount_[b] > 0)
        << "retain of unallocated block " << b;
    ++refcount_[b];
  }
}

void KvCache::release(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    CLEAVE_CHECK(b >= 0 && b < totalBlocks() && refcount_[b] > 0)
        << "release of unallocated block " << b;
    if (--refcount_[b] == 0) free_.push_back(b);
  }
}

int64_t KvCache::bytes() const {
  return 2 * options_.num_layers * options_.num_blocks * options_.block_size * options_.kv_dim *
         static_cast<int64_t>(sizeof(float));
}

}  // namespace cleave::engine
