// Which bytes of a prefill worker's KV cache go where in a decode worker's: for every
// layer, keys and values (or the one part of a latent cache), prompt block and the KV
// heads both a local rank and a remote rank hold, one write of (heads in common) x
// block_size x head_dim elements. Prefill and decode TP may differ either way; each write
// moves exactly the head slice the receiving rank owns.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "cleave/v1/worker.pb.h"
#include "services/engine/kv_storage.h"
#include "services/engine/tensor_parallel.h"
#include "services/transfer/kv_transport.h"

namespace cleave::worker {

// A remote rank's pool, as its RankEndpoint and the shared KvLayout describe it.
struct RemoteRankLayout {
  int64_t head_begin = 0;
  int64_t heads = 0;
  int64_t num_blocks = 0;
};

// The writes from `local` (holding heads `local_heads`) into `remote`, for prompt block i
// going from local block local_blocks[i] to remote block remote_blocks[i]. Empty when the
// two ranks share no head.
std::vector<transfer::Write> kvWrites(engine::KvStorage& local, engine::Span local_heads,
                                      const RemoteRankLayout& remote,
                                      std::span<const int32_t> local_blocks,
                                      std::span<const uint32_t> remote_blocks);

// A remote rank's linear-attention state slots (RankEndpoint, KvLayout).
struct RemoteStateLayout {
  int64_t key_head_begin = 0;
  int64_t key_heads = 0;
  int64_t slots = 0;
};

// Every destination rank's state slots (RankEndpoint linear_key_head_begin/end, state_bytes)
// for a model whose `layers` linear layers have `key_heads` key heads of `group_bytes` bytes
// each, checked before any byte moves: each rank's key heads a non-empty run inside
// [0, key_heads), every key head held by some rank (one no rank held would keep the slot's
// old state), and destination.state_slot() inside every rank's slots. InvalidArgument
// naming the rank, or the heads no rank holds, otherwise.
absl::StatusOr<std::vector<RemoteStateLayout>> remoteStateLayouts(
    const v1::KvDestination& destination, int64_t key_heads, int64_t layers, int64_t group_bytes);

// The writes of one sequence's linear-attention state from `local_state` (its slot on a
// rank holding key heads `local_heads`: [layer][head][group]) into slot `remote_slot` of
// `remote`, `group_bytes` per key head and layer: for each of `layers` layers, one write of
// the key heads both ranks hold. Empty when they share none.
std::vector<transfer::Write> stateWrites(const float* local_state, engine::Span local_heads,
                                         const RemoteStateLayout& remote, int64_t remote_slot,
                                         int64_t layers, int64_t group_bytes);

// Whether local rank `local_rank` of `local_ranks` sends destination rank `remote_index`
// its rows. Every pair that shares heads does, except for a replicated cache (MLA's
// latent, the same on every rank), which each destination rank gets once, from the local
// ranks in turn.
bool sendsToRank(bool replicated, int local_rank, int local_ranks, int remote_index);

}  // namespace cleave::worker
