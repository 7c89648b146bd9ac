#include "services/engine/kv_storage.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/log.h"

namespace cleave::engine {

void KvStorage::Free::operator()(uint8_t* p) const { std::free(p); }

KvStorage::KvStorage(const KvStorageOptions& options) : options_(options) {
  const int64_t total = bytes();
  // Page-aligned: transports register the whole pool.
  data_.reset(static_cast<uint8_t*>(
      std::aligned_alloc(4096, (std::max<int64_t>(total, 1) + 4095) / 4096 * 4096)));
  CLEAVE_CHECK(data_ != nullptr) << "cannot allocate " << total << " bytes of KV cache";
  std::memset(data_.get(), 0, total);
}

int64_t KvStorage::bytes() const { return options_.parts * options_.num_layers * poolBytes(); }

int64_t KvStorage::offset(int64_t layer, int kv, int64_t block, int64_t head) const {
  return (options_.parts * layer + kv) * poolBytes() +
         (block * options_.kv_heads + head) * headBlockBytes();
}

}  // namespace cleave::engine
