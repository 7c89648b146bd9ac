// The paged KV cache of one rank: for every layer a pool of `num_blocks` blocks, each
// `block_size` token rows of kv_heads * head_dim floats for keys and the same for values,
// plus the allocator that hands blocks to sequences. Blocks are reference-counted so a
// block can later be shared between sequences (prefix caching).
//
// Layout per layer: keys [num_blocks, block_size, kv_dim], values likewise.
//
// Threading: owned and used by one thread (the rank thread); not synchronized.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace cleave::engine {

struct KvCacheOptions {
  int64_t num_layers = 0;
  int64_t kv_dim = 0;  // kv_heads * head_dim
  int64_t block_size = 16;
  int64_t num_blocks = 0;
};

class KvCache {
 public:
  explicit KvCache(const KvCacheOptions& options);

  // Takes `count` free blocks (reference count 1 each). ResourceExhausted, taking
  // nothing, when fewer are free.
  absl::StatusOr<std::vector<int32_t>> allocate(int64_t count);
  // Adds a reference to each block (they must be allocated).
  void retain(std::span<const int32_t> blocks);
  // Drops a reference from each block; a block with none left is free again.
  void release(std::span<const int32_t> blocks);

  int64_t freeBlocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t totalBlocks() const { return options_.num_blocks; }
  int64_t blockSize() const { return options_.block_size; }
  int64_t kvDim() const { return options_.kv_dim; }
  // Blocks needed to hold `tokens` positions.
  int64_t blocksFor(int64_t tokens) const {
    return (tokens + options_.block_size - 1) / options_.block_size;
  }
  // Bytes of all layers' keys and values.
  int64_t bytes() const;

  float* keys(int64_t layer) { return keys_[layer].data(); }
  float* values(int64_t layer) { return values_[layer].data(); }

 private:
  KvCacheOptions options_;
  std::vector<std::vector<float>> keys_;
  std::vector<std::vector<float>> values_;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;  // A stack: the most recently freed block is reused first.
};

}  // namespace cleave::engine
