#include "services/engine/kv_storage.h"

#include <cstdlib>
#include <cstring>

#include "common/log.h"

namespace cleave::engine {

void KvStorage::Free::operator()(float* p) const { std::free(p); }

KvStorage::KvStorage(const KvStorageOptions& options) : options_(options) {
  const int64_t total = bytes();
  // Page-aligned: transports register the whole pool.
  data_.reset(static_cast<float*>(
      std::aligned_alloc(4096, (std::max<int64_t>(total, 1) + 4095) / 4096 * 4096)));
  CLEAVE_CHECK(data_ != nullptr) << "cannot allocate " << total << " bytes of KV cache";
  std::memset(data_.get(), 0, total);
}

int64_t KvStorage::bytes() const {
  return 2 * options_.num_layers * poolFloats() * static_cast<int64_t>(sizeof(float));
}

int64_t KvStorage::offset(int64_t layer, int kv, int64_t block, int64_t head) const {
  const int64_t floats = (2 * layer + kv) * poolFloats() + (block * options_.kv_heads + head) *
                                                               options_.block_size *
                                                               options_.head_dim;
  return floats * static_cast<int64_t>(sizeof(float));
}

}  // namespace cleave::engine
