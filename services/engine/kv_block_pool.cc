#include "services/engine/kv_block_pool.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/siphash.h"

namespace cleave::engine {

absl::Status validateBlockSize(int64_t block_size) {
  if (block_size >= 8 && block_size <= 256 && (block_size & (block_size - 1)) == 0)
    return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--block-size must be a power of two in 8..256, got ", block_size));
}

KvBlockPool::KvBlockPool(const KvBlockPoolOptions& options) : options_(options) {
  blocks_.resize(options.num_blocks);
  for (int64_t b = options.num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

void KvBlockPool::unpublish(int32_t block) {
  Block& b = blocks_[block];
  if (!b.hash) return;
  auto it = published_.find(*b.hash);
  if (it != published_.end() && it->second == block) published_.erase(it);
  b.hash.reset();
  b.tokens.clear();
}

absl::StatusOr<std::vector<int32_t>> KvBlockPool::allocate(int64_t count) {
  if (count > freeBlocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache: ", count, " blocks wanted, ",
                                                     freeBlocks(), " of ", totalBlocks(),
                                                     " available"));
  }
  std::vector<int32_t> out;
  while (static_cast<int64_t>(out.size()) < count && !free_.empty()) {
    out.push_back(free_.back());
    free_.pop_back();
  }
  while (static_cast<int64_t>(out.size()) < count) {
    const int32_t victim = evictable_.front();
    evictable_.pop_front();
    unpublish(victim);
    out.push_back(victim);
  }
  for (int32_t b : out) blocks_[b].refcount = 1;
  return out;
}

void KvBlockPool::retain(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    CLEAVE_CHECK(b >= 0 && b < totalBlocks()) << "retain of block " << b << " outside the cache";
    Block& block = blocks_[b];
    if (block.refcount == 0) {
      CLEAVE_CHECK(block.hash.has_value()) << "retain of unallocated block " << b;
      evictable_.erase(block.lru);  // A cached block comes back into use.
    }
    ++block.refcount;
  }
}

void KvBlockPool::release(std::span<const int32_t> blocks) {
  // Last block first: a sequence's tail, shared least, is evicted before its head.
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t b = *it;
    CLEAVE_CHECK(b >= 0 && b < totalBlocks() && blocks_[b].refcount > 0)
        << "release of unallocated block " << b;
    Block& block = blocks_[b];
    if (--block.refcount > 0) continue;
    if (block.hash) {
      block.lru = evictable_.insert(evictable_.end(), b);
    } else {
      free_.push_back(b);
    }
  }
}

uint64_t KvBlockPool::chainHash(uint64_t parent, std::span<const uint32_t> tokens) {
  // The parent, then the tokens, little-endian: one buffer for the keyed hash (on the
  // stack for a block of up to 64 tokens: this runs for every block looked up or computed).
  absl::InlinedVector<uint8_t, 8 + 4 * 64> bytes(8 + 4 * tokens.size());
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(parent >> (8 * i));
  for (size_t t = 0; t < tokens.size(); ++t) {
    for (int i = 0; i < 4; ++i) bytes[8 + 4 * t + i] = static_cast<uint8_t>(tokens[t] >> (8 * i));
  }
  return sipHash24(processSipKey(), bytes);
}

uint64_t KvBlockPool::adapterRoot(std::string_view sha256) {
  // Apart from every chain hash: those hash at least 8 bytes of parent first, this a
  // leading marker byte and the fingerprint.
  std::vector<uint8_t> bytes{0xad};
  bytes.insert(bytes.end(), sha256.begin(), sha256.end());
  const uint64_t hash = sipHash24(processSipKey(), bytes);
  return hash == 0 ? 1 : hash;
}

uint64_t KvBlockPool::saltedRoot(uint64_t root, std::string_view salt) {
  if (salt.empty()) return root;
  // A marker byte of its own, the root, then the salt.
  std::vector<uint8_t> bytes{0x5a};
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(root >> (8 * i)));
  bytes.insert(bytes.end(), salt.begin(), salt.end());
  const uint64_t hash = sipHash24(processSipKey(), bytes);
  return hash == 0 ? 1 : hash;
}

void KvBlockPool::publish(int32_t block, uint64_t hash, std::span<const uint32_t> tokens) {
  CLEAVE_CHECK(block >= 0 && block < totalBlocks() && blocks_[block].refcount > 0)
      << "publish of block " << block;
  if (published_.count(hash) || blocks_[block].hash) return;
  published_.emplace(hash, block);
  blocks_[block].hash = hash;
  blocks_[block].tokens.assign(tokens.begin(), tokens.end());
}

std::optional<int32_t> KvBlockPool::lookup(uint64_t hash, std::span<const uint32_t> tokens) const {
  auto it = published_.find(hash);
  if (it == published_.end()) return std::nullopt;
  const Block& b = blocks_[it->second];
  if (!std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin(), tokens.end()))
    return std::nullopt;
  return it->second;
}

}  // namespace cleave::engine
