#include "services/router/token_relay.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "grpcpp/client_context.h"

namespace cleave::router {

std::optional<absl::StatusOr<v1::SequenceEvent>> Mailbox::next(std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !events_.empty() || !failure_.ok();
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), absl::FromChrono(timeout));
  if (!events_.empty()) {
    v1::SequenceEvent event = std::move(events_.front());
    events_.pop_front();
    // Events that queued up while the reader of this mailbox was busy (writing the last ones
    // to its client) go as one: one wake-up and one write for all of them, not one per token.
    while (!events_.empty() && !event.has_finish_reason()) {
      v1::SequenceEvent& later = events_.front();
      event.mutable_token_ids()->MergeFrom(later.token_ids());
      event.mutable_logprobs()->MergeFrom(later.logprobs());
      event.set_batch_wait_us(event.batch_wait_us() + later.batch_wait_us());
      if (later.has_finish_reason()) event.set_finish_reason(later.finish_reason());
      event.set_matched_stop(std::move(*later.mutable_matched_stop()));
      events_.pop_front();
    }
    return event;
  }
  if (!failure_.ok()) return failure_;
  return std::nullopt;
}

void Mailbox::push(v1::SequenceEvent event) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(event));
}

void Mailbox::fail(absl::Status status) {
  absl::MutexLock lock(&mu_);
  failure_ = std::move(status);
}

struct TokenRelay::Reader {
  std::shared_ptr<const Worker> worker;
  std::atomic<bool> stop{false};
  absl::Mutex mu;
  grpc::ClientContext* context ABSL_GUARDED_BY(mu) = nullptr;  // The call in progress.
  std::thread thread;
};

TokenRelay::TokenRelay(std::string router_id, std::shared_ptr<LostWorkers> lost)
    : router_id_(std::move(router_id)), lost_(std::move(lost)) {}

TokenRelay::~TokenRelay() {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, reader] : readers_) ids.push_back(id);
  }
  for (const std::string& id : ids) removeWorker(id);
}

void TokenRelay::addWorker(std::shared_ptr<const Worker> worker) {
  if (!worker->servesDecode()) return;
  auto reader = std::make_unique<Reader>();
  reader->worker = std::move(worker);
  Reader* r = reader.get();
  // Running before anyone can find it: whoever removes it joins a started thread.
  r->thread = std::thread([this, r] { read(*r); });
  std::unique_ptr<Reader> earlier;  // The same id registered again: its stream ends.
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Reader>& slot = readers_[r->worker->id];
    earlier = std::move(slot);
    slot = std::move(reader);
  }
  if (earlier != nullptr) stopReading(*earlier);
}

void TokenRelay::removeWorker(const std::string& worker_id) {
  std::unique_ptr<Reader> reader;
  std::vector<std::shared_ptr<Mailbox>> orphans;
  {
    absl::MutexLock lock(&mu_);
    auto it = readers_.find(worker_id);
    if (it != readers_.end()) {
      reader = std::move(it->second);
      readers_.erase(it);
    }
    for (const auto& [request, open] : mailboxes_) {
      if (open.worker_id == worker_id) orphans.push_back(open.mailbox);
    }
  }
  for (auto& mailbox : orphans) {
    mailbox->fail(absl::UnavailableError(
        absl::StrCat("decode worker ", worker_id, " left while the request was running")));
  }
  if (reader != nullptr) stopReading(*reader);
}

void TokenRelay::stopReading(Reader& reader) {
  reader.stop = true;
  {
    absl::MutexLock lock(&reader.mu);
    if (reader.context != nullptr) reader.context->TryCancel();
  }
  reader.thread.join();
}

void TokenRelay::read(Reader& reader) {
  v1::StreamTokensRequest request;
  request.set_router_id(router_id_);
  int unreachable = 0;  // Calls in a row that ended UNAVAILABLE without a message.
  while (!reader.stop) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&reader.mu);
      reader.context = &context;
    }
    if (reader.stop) context.TryCancel();
    auto stream = reader.worker->decode->StreamTokens(&context, request);
    v1::TokenEvents message;
    bool read_any = false;
    while (stream->Read(&message)) {
      read_any = true;
      absl::MutexLock lock(&mu_);
      for (v1::SequenceEvent& event : *message.mutable_events()) {
        auto it = mailboxes_.find(event.request_id());
        // Only the worker the request is on now: a worker it left (and that registered
        // again) may still send what it had queued for it.
        if (it != mailboxes_.end() && it->second.worker_id == reader.worker->id) {
          it->second.mailbox->push(std::move(event));
        }
      }
    }
    grpc::Status status = stream->Finish();
    {
      absl::MutexLock lock(&reader.mu);
      reader.context = nullptr;
    }
    if (reader.stop) break;
    unreachable =
        status.error_code() == grpc::StatusCode::UNAVAILABLE && !read_any ? unreachable + 1 : 0;
    if (unreachable == 3 && lost_ != nullptr) {
      CLEAVE_LOG(WARNING) << "decode worker " << reader.worker->id
                          << " cannot be reached; dropping it";
      lost_->add(reader.worker->id);
    }
    CLEAVE_LOG(WARNING) << "token stream from " << reader.worker->id
                        << " ended: " << status.error_message() << "; reopening";
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

std::shared_ptr<Mailbox> TokenRelay::open(const std::string& request_id,
                                          const std::string& worker_id) {
  auto mailbox = std::make_shared<Mailbox>();
  absl::MutexLock lock(&mu_);
  // A worker that left before this: nothing will come (removeWorker failed the mailboxes
  // open then); the request moves on at once.
  if (!readers_.contains(worker_id)) {
    mailbox->fail(absl::UnavailableError(
        absl::StrCat("decode worker ", worker_id, " left before the request started decoding")));
  }
  mailboxes_[request_id] = {.mailbox = mailbox, .worker_id = worker_id};
  return mailbox;
}

void TokenRelay::close(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  mailboxes_.erase(request_id);
}

}  // namespace cleave::router
