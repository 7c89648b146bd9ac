#include "services/transfer/kv_transport.h"

#include "absl/strings/str_cat.h"
#include "common/faults.h"

namespace cleave::transfer {

absl::Status writeAndWait(KvTransport& transport, const RemoteRegion& target,
                          std::span<const Write> writes, std::chrono::milliseconds timeout,
                          const std::function<bool()>& stop) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (faults::fire("kv_put_fail")) {
    return absl::UnavailableError("injected fault kv_put_fail: the put was not posted");
  }
  absl::StatusOr<std::unique_ptr<Transfer>> transfer = transport.post(target, writes);
  if (!transfer.ok()) return transfer.status();
  while (true) {
    absl::StatusOr<bool> done = transport.poll(**transfer);
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    if (stop && stop()) {
      transport.abandon(**transfer);
      return absl::AbortedError("the KV transfer was stopped");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      // Stopped before the caller reuses its rows or the peer reassigns the target's.
      transport.abandon(**transfer);
      return absl::DeadlineExceededError(
          absl::StrCat("the KV transfer did not complete within ", timeout.count(), " ms"));
    }
  }
}

}  // namespace cleave::transfer
