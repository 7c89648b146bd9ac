#include "common/client_watch.h"

#include <algorithm>

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
  ClientWatch& watch = *watch_;
  absl::MutexLock lock(&watch.mu_);
  watch.watched_.erase(id_);
  // A pass looking at this response's connection finishes before the response may go.
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(watch.mu_) {
    return std::find(watch.looking_.begin(), watch.looking_.end(), id_) == watch.looking_.end();
  };
  watch.mu_.Await(absl::Condition(&done));
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
    std::vector<std::pair<uint64_t, HttpResponse*>> due;
    for (const auto& [id, watched] : watched_) {
      if (watched.since <= settled) due.emplace_back(id, watched.response);
    }
    if (due.empty()) continue;
    for (const auto& [id, response] : due) looking_.push_back(id);
    std::vector<uint64_t> gone;
    mu_.Unlock();
    for (const auto& [id, response] : due) {
      if (response->clientGone()) gone.push_back(id);
    }
    mu_.Lock();
    looking_.clear();
    for (uint64_t id : gone) {
      // A ticket destroyed meanwhile took its entry: nothing to call.
      if (auto it = watched_.find(id); it != watched_.end()) {
        it->second.gone();
        watched_.erase(it);  // Once.
      }
    }
  }
}

}  // namespace cleave
