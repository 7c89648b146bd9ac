// Slots of the host rows a worker's KV transfers pass through when its cache lives
// elsewhere (a GPU): block-sized rows of the group's host rows (TpGroup::kv), lent to one
// transfer at a time. A worker keeps two of these over disjoint rows: sends (a prompt
// computed here, copied out and written to a decode worker) hold theirs only while they
// copy and write; receives (a reserved prompt, written in by a prefill worker) hold theirs
// from Reserve until StartDecode copies them in. Apart, receives held as long as their
// prefills take never keep a send waiting, so two workers sending to each other cannot wait
// on each other forever.
//
// Threading: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace cleave::worker {

class KvStagingSlots {
 public:
  // Rows [first, first + count); `what` names them and the flag that sizes them in errors.
  // `on_change`, if set, gets the number of free slots at once and after every change
  // (under the slots' lock: it must not call back in).
  KvStagingSlots(int32_t first, int64_t count, std::string what,
                 std::function<void(int64_t)> on_change = nullptr);

  // `n` slots, lowest first, waiting while too few are free: ResourceExhausted once
  // `deadline` passes, Cancelled once `cancelled` (polled) says so. InvalidArgument when
  // `n` is more than there are.
  absl::StatusOr<std::vector<int32_t>> take(int64_t n, absl::Time deadline,
                                            const std::function<bool()>& cancelled = nullptr);
  // Returns slots taken before.
  void give(std::span<const int32_t> slots);

  int64_t size() const { return count_; }
  int64_t available() const;

 private:
  const int32_t first_;
  const int64_t count_;
  const std::string what_;
  const std::function<void(int64_t)> on_change_;
  mutable absl::Mutex mu_;
  absl::CondVar freed_;
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);  // descending: the lowest at the back
};

// How many blocks of host rows each side of a staging worker gets: a sending side
// (prefill), which sends a prompt a chunk at a time, `staging_tokens` (0: kSendBlocks, or
// the whole context when shorter); a receiving side (decode), which holds a whole prompt
// from Reserve to StartDecode, that many again or, at 0, the larger of a whole-context
// prompt and four planned-length sequences' worth, at most the pool. A prompt larger than
// the receiving side is refused (KvStagingSlots::take), naming --kv-staging-tokens.
inline constexpr int64_t kSendBlocks = 256;
struct StagingSizes {
  int64_t send = 0;
  int64_t receive = 0;
};
StagingSizes planStaging(bool sends, bool receives, int64_t staging_tokens, int64_t context,
                         int64_t planned_seq_len, int64_t pool_blocks, int64_t block_size);

}  // namespace cleave::worker
