// The allocator of the paged KV cache: hands out block ids of `num_blocks` blocks of
// `block_size` token positions to sequences. One pool serves a whole tensor-parallel group:
// every rank stores its own KV heads of block b in its own KvStorage (kv_storage.h), so one
// block id means the same token positions on every rank.
//
// Blocks are reference-counted. A full block of prompt tokens can be published under the
// hash chain of its tokens (prefix caching): later sequences that start with the same
// tokens take a reference to it instead of recomputing it. A published block nobody uses
// stays cached until allocation needs the space (least recently used first).
//
// Threading: owned and used by one thread (the scheduler's); not synchronized.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace cleave::engine {

struct KvBlockPoolOptions {
  int64_t block_size = 16;
  int64_t num_blocks = 0;
};

// The block sizes a worker serves with (--block-size): powers of two in 8..256.
// InvalidArgument naming the flag otherwise.
absl::Status validateBlockSize(int64_t block_size);

// The longest cache salt a request may name (GenerationRequest::cache_salt).
inline constexpr size_t kMaxCacheSaltBytes = 256;

class KvBlockPool {
 public:
  explicit KvBlockPool(const KvBlockPoolOptions& options);

  // Takes `count` blocks (reference count 1 each): free ones first, then cached ones
  // nobody uses, oldest first. ResourceExhausted, taking nothing, when fewer are available.
  absl::StatusOr<std::vector<int32_t>> allocate(int64_t count);
  // Adds a reference to each block (allocated, or cached and unused).
  void retain(std::span<const int32_t> blocks);
  // Drops a reference from each block; an unreferenced block becomes free, or stays cached
  // if it is published (the blocks of one call evictable last to first: a sequence's head,
  // which more requests share, outlives its tail).
  void release(std::span<const int32_t> blocks);

  // Prefix caching. The hash of block i of a sequence chains the hash of block i - 1
  // (0 for the first) with the block's tokens, keyed by a secret of this process
  // (SipHash-2-4): nobody can choose tokens whose blocks collide with another's prefix and
  // so read, or poison, a cache entry that is not theirs. Hashes mean nothing to another
  // process (each keeps its own: the router's name blocks only in its own index).
  static uint64_t chainHash(uint64_t parent, std::span<const uint32_t> tokens);
  // The chain's start for the requests of a LoRA adapter (by its fingerprint): their KV
  // differs from the base model's for the same tokens.
  static uint64_t adapterRoot(std::string_view sha256);
  // The chain's start for the requests that name `salt` (vLLM's cache_salt), from the
  // adapter's (or the base model's, 0): only requests of one salt share cached blocks, so
  // one tenant cannot tell from its timings what another's prompts were. No salt: `root`.
  // At most kMaxCacheSaltBytes.
  static uint64_t saltedRoot(uint64_t root, std::string_view salt);
  // Publishes `block` (full, computed) under `hash`. A hash already published keeps its
  // block.
  void publish(int32_t block, uint64_t hash, std::span<const uint32_t> tokens);
  // The published block for `hash` holding exactly `tokens`, if any.
  std::optional<int32_t> lookup(uint64_t hash, std::span<const uint32_t> tokens) const;
  // Whether `block` is published (its KV is a cached prefix's: not to be written).
  bool published(int32_t block) const { return blocks_[block].hash.has_value(); }

  // Blocks allocate() can hand out now (free + cached and unused).
  int64_t freeBlocks() const { return static_cast<int64_t>(free_.size() + evictable_.size()); }
  int64_t totalBlocks() const { return options_.num_blocks; }
  // Free blocks that still hold a published prefix (reused on a hit, evicted LRU).
  int64_t cachedBlocks() const { return static_cast<int64_t>(evictable_.size()); }
  int64_t blockSize() const { return options_.block_size; }
  // Blocks needed to hold `tokens` positions.
  int64_t blocksFor(int64_t tokens) const {
    return (tokens + options_.block_size - 1) / options_.block_size;
  }

 private:
  struct Block {
    int32_t refcount = 0;
    std::optional<uint64_t> hash;  // Set while published.
    std::vector<uint32_t> tokens;  // What the hash stands for (checked on lookup).
    std::list<int32_t>::iterator lru;
  };
  void unpublish(int32_t block);

  KvBlockPoolOptions options_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;     // Unreferenced, unpublished; the last freed is reused first.
  std::list<int32_t> evictable_;  // Unreferenced, published; least recently used first.
  std::unordered_map<uint64_t, int32_t> published_;
};

}  // namespace cleave::engine
