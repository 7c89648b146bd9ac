// The key and value rows of one rank's share of the paged KV cache, in one allocation (so
// a KV transport registers it once):
//
//   [layer][K, V][block][kv head of this rank][position in the block][head_dim]
//
// in one element type (f32, bf16 or e4m3: cpu::KvType). A cache of one part (MLA's
// latent rows, model::KvCacheShape) has no separate values: values(l) is keys(l).
//
// One head's part of one block of one layer's keys is contiguous (block_size * head_dim
// elements), and so is any run of consecutive heads: what a transfer between workers with
// different TP layouts moves. Which block holds which positions of which sequence is the
// KvBlockPool's business (kv_block_pool.h); storage only holds the rows.
//
// A model with linear-attention layers (model::LinearAttentionConfig) keeps their per-sequence
// state apart, in `state_slots` slots of `state_floats` floats each (every linear layer's
// state of this rank's heads, gated_delta_net.h); a sequence's chunks name their slot
// (SequenceChunk::state). Those layers have no KV rows: num_layers counts the others.
//
// Threading: written and read by one rank thread; a KV transport may read or write
// blocks the scheduler has handed to a transfer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "kernels/cpu/kv_format.h"

namespace cleave::engine {

struct KvStorageOptions {
  int64_t num_layers = 0;
  int64_t kv_heads = 0;  // This rank's.
  int64_t head_dim = 0;
  int64_t block_size = 16;
  int64_t num_blocks = 0;
  cpu::KvType type = cpu::KvType::kF32;
  int parts = 2;  // Keys and values; 1: the keys are read as values too.
  int64_t state_slots = 0;
  int64_t state_floats = 0;  // Per slot.
};

class KvStorage {
 public:
  explicit KvStorage(const KvStorageOptions& options);

  const KvStorageOptions& options() const { return options_; }
  int64_t totalBlocks() const { return options_.num_blocks; }
  int64_t blockSize() const { return options_.block_size; }
  int64_t kvHeads() const { return options_.kv_heads; }
  int64_t headDim() const { return options_.head_dim; }
  int64_t blocksFor(int64_t tokens) const {
    return (tokens + options_.block_size - 1) / options_.block_size;
  }
  // Bytes of all layers' keys and values.
  int64_t bytes() const;
  uint8_t* data() { return data_.get(); }
  cpu::KvType type() const { return options_.type; }

  // Layer `layer`'s keys (values): [block][kv head][position][head_dim] elements.
  uint8_t* keys(int64_t layer) { return data_.get() + options_.parts * layer * poolBytes(); }
  uint8_t* values(int64_t layer) { return keys(layer) + (options_.parts - 1) * poolBytes(); }
  int parts() const { return options_.parts; }
  // Slot `slot`'s linear-attention state: state_floats floats (zero when allocated).
  int64_t stateSlots() const { return options_.state_slots; }
  float* state(int64_t slot) { return states_.get() + slot * options_.state_floats; }
  // Byte offset in data() of heads [head, ...) of `block` of layer `layer`'s keys
  // (kv = 0) or values (kv = 1 < parts()); one head's part of a block is headBlockBytes()
  // long.
  int64_t offset(int64_t layer, int kv, int64_t block, int64_t head) const;
  int64_t headBlockBytes() const {
    return options_.block_size * options_.head_dim * cpu::kvElementBytes(options_.type);
  }

 private:
  // Bytes of one layer's keys (or values).
  int64_t poolBytes() const { return options_.num_blocks * options_.kv_heads * headBlockBytes(); }

  KvStorageOptions options_;
  std::shared_ptr<uint8_t> data_;  // On huge pages (kernels/cpu/huge_pages.h).
  std::unique_ptr<float[]> states_;
};

// Copies every layer's keys and values of block from_blocks[i] of `from` into block
// to_blocks[i] of `to`. The two must have the same shape but for their number of blocks,
// and the spans the same length, with ids inside each side (checked).
void copyBlocks(KvStorage& from, std::span<const int32_t> from_blocks, KvStorage& to,
                std::span<const int32_t> to_blocks);

}  // namespace cleave::engine
