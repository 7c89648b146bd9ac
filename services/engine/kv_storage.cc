#include "services/engine/kv_storage.h"

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "kernels/cpu/huge_pages.h"

namespace cleave::engine {

KvStorage::KvStorage(const KvStorageOptions& options) : options_(options) {
  const int64_t total = bytes();
  // Page-aligned: transports register the whole pool.
  data_ = cpu::allocateOnHugePages(std::max<int64_t>(total, 1), 4096);
  CLEAVE_CHECK(data_ != nullptr) << "cannot allocate " << total << " bytes of KV cache";
  std::memset(data_.get(), 0, total);  // Zero already; touched now so no step faults it in.
  states_ = std::make_unique<float[]>(options_.state_slots * options_.state_floats);
}

int64_t KvStorage::bytes() const { return options_.parts * options_.num_layers * poolBytes(); }

int64_t KvStorage::offset(int64_t layer, int kv, int64_t block, int64_t head) const {
  return (options_.parts * layer + kv) * poolBytes() +
         (block * options_.kv_heads + head) * headBlockBytes();
}

void copyBlocks(KvStorage& from, std::span<const int32_t> from_blocks, KvStorage& to,
                std::span<const int32_t> to_blocks) {
  const KvStorageOptions& a = from.options();
  const KvStorageOptions& b = to.options();
  CLEAVE_CHECK(a.num_layers == b.num_layers && a.kv_heads == b.kv_heads &&
               a.head_dim == b.head_dim && a.block_size == b.block_size && a.type == b.type &&
               a.parts == b.parts && from_blocks.size() == to_blocks.size());
  const size_t bytes = static_cast<size_t>(a.kv_heads * from.headBlockBytes());
  for (size_t i = 0; i < from_blocks.size(); ++i) {
    CLEAVE_CHECK(from_blocks[i] >= 0 && from_blocks[i] < a.num_blocks && to_blocks[i] >= 0 &&
                 to_blocks[i] < b.num_blocks);
    for (int64_t l = 0; l < a.num_layers; ++l) {
      for (int kv = 0; kv < a.parts; ++kv) {
        std::memcpy(to.data() + to.offset(l, kv, to_blocks[i], 0),
                    from.data() + from.offset(l, kv, from_blocks[i], 0), bytes);
      }
    }
  }
}

}  // namespace cleave::engine
