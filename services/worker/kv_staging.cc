#include "services/worker/kv_staging.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace cleave::worker {

KvStagingSlots::KvStagingSlots(int32_t first, int64_t count, std::string what,
                               std::function<void(int64_t)> on_change)
    : first_(first), count_(count), what_(std::move(what)), on_change_(std::move(on_change)) {
  for (int64_t i = count - 1; i >= 0; --i) free_.push_back(first + static_cast<int32_t>(i));
  if (on_change_) on_change_(count_);
}

absl::StatusOr<std::vector<int32_t>> KvStagingSlots::take(int64_t n, absl::Time deadline,
                                                          const std::function<bool()>& cancelled) {
  if (n > count_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a transfer of ", n, " KV blocks is larger than ", what_, " (", count_, " blocks)"));
  }
  absl::MutexLock lock(&mu_);
  while (static_cast<int64_t>(free_.size()) < n) {
    const absl::Time now = absl::Now();
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("cancelled while waiting for ", what_));
    }
    if (now >= deadline) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what_, " stayed full: ", count_ - static_cast<int64_t>(free_.size()), " of ",
                       count_, " blocks held by transfers in flight, ", n, " wanted"));
    }
    // Wakes at least every 20 ms to poll `cancelled`.
    freed_.WaitWithDeadline(&mu_, std::min(deadline, now + absl::Milliseconds(20)));
  }
  std::vector<int32_t> taken(free_.end() - n, free_.end());
  std::reverse(taken.begin(), taken.end());
  free_.resize(free_.size() - static_cast<size_t>(n));
  if (on_change_) on_change_(static_cast<int64_t>(free_.size()));
  return taken;
}

void KvStagingSlots::give(std::span<const int32_t> slots) {
  if (slots.empty()) return;
  absl::MutexLock lock(&mu_);
  for (int32_t slot : slots) {
    CLEAVE_CHECK(slot >= first_ && slot < first_ + count_);
    free_.push_back(slot);
  }
  std::sort(free_.begin(), free_.end(), std::greater<>());
  CLEAVE_CHECK(std::adjacent_find(free_.begin(), free_.end()) == free_.end());  // given twice
  if (on_change_) on_change_(static_cast<int64_t>(free_.size()));
  freed_.SignalAll();
}

int64_t KvStagingSlots::available() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_.size());
}

StagingSizes planStaging(bool sends, bool receives, int64_t staging_tokens, int64_t context,
                         int64_t planned_seq_len, int64_t pool_blocks, int64_t block_size) {
  auto blocks = [block_size](int64_t tokens) { return (tokens + block_size - 1) / block_size; };
  StagingSizes sizes;
  if (sends) {
    sizes.send =
        staging_tokens > 0 ? blocks(staging_tokens) : std::min(kSendBlocks, blocks(context));
  }
  if (receives) {
    sizes.receive = std::min(
        pool_blocks, staging_tokens > 0 ? blocks(staging_tokens)
                                        : std::max(blocks(context), 4 * blocks(planned_seq_len)));
  }
  return sizes;
}

}  // namespace cleave::worker
