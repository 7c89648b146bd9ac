#include "common/client_watch.h"

namespace cleave {

ClientWatch::ClientWatch(std::chrono::milliseconds period, std::chrono::milliseconds settle)
    : period_(period), settle_(settle), thread_([this] { run(); }) {}

ClientWatch::~ClientWatch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

ClientWatch::Ticket::~Ticket() {
  if (watch_ == nullptr) return;
  absl::MutexLock lock(&watch_->mu_);
  watch_->watched_.erase(id_);
}

ClientWatch::Ticket ClientWatch::watch(HttpResponse& response, std::function<void()> gone) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  watched_.emplace(id, Watched{.response = &response,
                               .gone = std::move(gone),
                               .since = std::chrono::steady_clock::now()});
  return Ticket(this, id);
}

void ClientWatch::run() {
  absl::MutexLock lock(&mu_);
  auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  while (!stop_) {
    // Idle until something is watched; then every period.
    auto busy = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !watched_.empty(); };
    mu_.Await(absl::Condition(&busy));
    if (stop_) break;
    mu_.AwaitWithTimeout(absl::Condition(&wake), absl::FromChrono(period_));
    const auto settled = std::chrono::steady_clock::now() - settle_;
    for (auto it = watched_.begin(); it != watched_.end();) {
      if (it->second.since <= settled && it->second.response->clientGone()) {
        it->second.gone();
        it = watched_.erase(it);  // Once.
      } else {
        ++it;
      }
    }
  }
}

}  // namespace cleave
