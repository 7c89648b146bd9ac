#include "services/worker/kv_copy_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace cleave::worker {

std::vector<transfer::Write> kvWrites(engine::KvStorage& local, engine::Span local_heads,
                                      const RemoteRankLayout& remote,
                                      std::span<const int32_t> local_blocks,
                                      std::span<const uint32_t> remote_blocks) {
  std::vector<transfer::Write> writes;
  const int64_t first = std::max(local_heads.begin, remote.head_begin);
  const int64_t last =
      std::min(local_heads.begin + local_heads.size, remote.head_begin + remote.heads);
  if (first >= last) return writes;
  const engine::KvStorageOptions& o = local.options();
  const int64_t head_block = local.headBlockBytes();
  const uint64_t bytes = static_cast<uint64_t>((last - first) * head_block);
  // The remote pool has the local layout with its own block count and heads.
  auto remoteOffset = [&](int64_t layer, int kv, int64_t block) {
    return static_cast<uint64_t>(
        (((o.parts * layer + kv) * remote.num_blocks + block) * remote.heads +
         (first - remote.head_begin)) *
        head_block);
  };
  for (int64_t layer = 0; layer < o.num_layers; ++layer) {
    for (int kv = 0; kv < o.parts; ++kv) {
      for (size_t i = 0; i < local_blocks.size(); ++i) {
        writes.push_back({.local = local.data() + local.offset(layer, kv, local_blocks[i],
                                                               first - local_heads.begin),
                          .remote_offset = remoteOffset(layer, kv, remote_blocks[i]),
                          .bytes = bytes});
      }
    }
  }
  return writes;
}

absl::StatusOr<std::vector<RemoteStateLayout>> remoteStateLayouts(
    const v1::KvDestination& destination, int64_t key_heads, int64_t layers, int64_t group_bytes) {
  if (!destination.has_state_slot()) {
    return absl::InvalidArgumentError(
        "destination.state_slot is required: the model's linear-attention layers keep a state "
        "per sequence (ReserveResponse.state_slot)");
  }
  std::vector<bool> covered(static_cast<size_t>(key_heads), false);
  std::vector<RemoteStateLayout> layouts;
  for (const v1::RankEndpoint& rank : destination.ranks()) {
    const int64_t begin = rank.linear_key_head_begin(), end = rank.linear_key_head_end();
    const int64_t slot_bytes = layers * (end - begin) * group_bytes;
    const int64_t slots =
        slot_bytes > 0
            ? static_cast<int64_t>(rank.state_bytes() / static_cast<uint64_t>(slot_bytes))
            : 0;
    if (end <= begin || end > key_heads || slots <= int64_t{destination.state_slot()}) {
      return absl::InvalidArgumentError(
          absl::StrCat("destination rank ", rank.rank(), " has linear-attention key heads [", begin,
                       ", ", end, ") of ", key_heads, " and ", rank.state_bytes(),
                       " bytes of state slots: no slot ", destination.state_slot()));
    }
    for (int64_t h = begin; h < end; ++h) covered[h] = true;
    layouts.push_back({.key_head_begin = begin, .key_heads = end - begin, .slots = slots});
  }
  if (const auto missing = std::find(covered.begin(), covered.end(), false);
      missing != covered.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "destination ranks do not hold every one of the ", key_heads,
        " linear-attention key heads (none holds key head ", missing - covered.begin(), ")"));
  }
  return layouts;
}

std::vector<transfer::Write> stateWrites(const float* local_state, engine::Span local_heads,
                                         const RemoteStateLayout& remote, int64_t remote_slot,
                                         int64_t layers, int64_t group_bytes) {
  std::vector<transfer::Write> writes;
  const int64_t first = std::max(local_heads.begin, remote.key_head_begin);
  const int64_t last =
      std::min(local_heads.begin + local_heads.size, remote.key_head_begin + remote.key_heads);
  if (first >= last) return writes;
  const auto* bytes = reinterpret_cast<const uint8_t*>(local_state);
  for (int64_t layer = 0; layer < layers; ++layer) {
    const int64_t local_at = (layer * local_heads.size + first - local_heads.begin) * group_bytes;
    const int64_t remote_at =
        ((remote_slot * layers + layer) * remote.key_heads + first - remote.key_head_begin) *
        group_bytes;
    writes.push_back({.local = bytes + local_at,
                      .remote_offset = static_cast<uint64_t>(remote_at),
                      .bytes = static_cast<uint64_t>((last - first) * group_bytes)});
  }
  return writes;
}

bool sendsToRank(bool replicated, int local_rank, int local_ranks, int remote_index) {
  return !replicated || remote_index % local_ranks == local_rank;
}

}  // namespace cleave::worker
