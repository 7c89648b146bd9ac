// Reads every decode worker's token stream (DecodeControl.StreamTokens, one per worker)
// and hands each sequence's events to the mailbox of the request waiting for them.
//
// Threading: thread-safe; one reader thread per worker.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/router/worker_pool.h"

namespace cleave::router {

class Mailbox {
 public:
  // The next event, waiting up to `timeout` (nullopt when none came); an error when the
  // worker's stream was lost for good. Events queued since the last call come as one, their
  // tokens (and logprobs) in order, ending where one finishes the sequence.
  std::optional<absl::StatusOr<v1::SequenceEvent>> next(std::chrono::milliseconds timeout);
  void push(v1::SequenceEvent event);
  void fail(absl::Status status);

 private:
  absl::Mutex mu_;
  std::deque<v1::SequenceEvent> events_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

class TokenRelay {
 public:
  // A decode worker whose token stream fails to reopen three times in a row (about 0.6 s)
  // is reported to `lost` (may be null).
  TokenRelay(std::string router_id, std::shared_ptr<LostWorkers> lost = nullptr);
  ~TokenRelay();

  const std::string& routerId() const { return router_id_; }
  // Starts reading `worker`'s token stream; one of the same id read before stops.
  void addWorker(std::shared_ptr<const Worker> worker);
  // Stops reading `worker_id` and fails the mailboxes of its requests (Unavailable).
  void removeWorker(const std::string& worker_id);

  // The mailbox of `request_id`, decoding on `worker_id`. Open it before StartDecode. A
  // worker no longer read (it left) gives a mailbox failed with Unavailable.
  std::shared_ptr<Mailbox> open(const std::string& request_id, const std::string& worker_id);
  void close(const std::string& request_id);

 private:
  struct Reader;
  void read(Reader& reader);
  // Ends `reader`'s stream and joins its thread (it must be out of readers_).
  void stopReading(Reader& reader);

  const std::string router_id_;
  const std::shared_ptr<LostWorkers> lost_;
  absl::Mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<Reader>> readers_ ABSL_GUARDED_BY(mu_);
  struct Open {
    std::shared_ptr<Mailbox> mailbox;
    std::string worker_id;
  };
  std::unordered_map<std::string, Open> mailboxes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cleave::router
