#include "services/engine/kv_storage.h"

namespace cleave::engine {

KvStorage::KvStorage(const KvStorageOptions& options) : options_(options) {
  const int64_t floats = options.num_blocks * options.block_size * options.kv_dim;
  keys_.assign(options.num_layers, std::vector<float>(floats));
  values_.assign(options.num_layers, std::vector<float>(floats));
}

int64_t KvStorage::bytes() const {
  return 2 * options_.num_layers * options_.num_blocks * options_.block_size * options_.kv_dim *
         static_cast<int64_t>(sizeof(float));
}

}  // namespace cleave::engine
