// The key and value rows of one rank's share of the paged KV cache: for every layer,
// `num_blocks` blocks of `block_size` token rows, each row kv_dim floats (this rank's KV
// heads x head_dim) for keys and the same for values. Which block holds which positions
// of which sequence is the KvBlockPool's business (kv_block_pool.h); storage only holds
// the rows.
//
// Layout per layer: keys [num_blocks, block_size, kv_dim], values likewise.
//
// Threading: written and read by one rank thread.
#pragma once

#include <cstdint>
#include <vector>

namespace cleave::engine {

struct KvStorageOptions {
  int64_t num_layers = 0;
  int64_t kv_dim = 0;  // kv_heads * head_dim of this rank
  int64_t block_size = 16;
  int64_t num_blocks = 0;
};

class KvStorage {
 public:
  explicit KvStorage(const KvStorageOptions& options);

  int64_t totalBlocks() const { return options_.num_blocks; }
  int64_t blockSize() const { return options_.block_size; }
  int64_t kvDim() const { return options_.kv_dim; }
  int64_t blocksFor(int64_t tokens) const {
    return (tokens + options_.block_size - 1) / options_.block_size;
  }
  // Bytes of all layers' keys and values.
  int64_t bytes() const;

  float* keys(int64_t layer) { return keys_[layer].data(); }
  float* values(int64_t layer) { return values_[layer].data(); }
  const float* keys(int64_t layer) const { return keys_[layer].data(); }
  const float* values(int64_t layer) const { return values_[layer].data(); }

 private:
  KvStorageOptions options_;
  std::vector<std::vector<float>> keys_;
  std::vector<std::vector<float>> values_;
};

}  // namespace cleave::engine
