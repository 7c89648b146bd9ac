// Notices HTTP clients that go away while their responses are still being computed: a
// response that is sent whole writes nothing until the end, so nothing else would notice.
// One thread looks at the connection of every response watched for at least `settle` each
// period and calls the watch's callback (once) for a client that has closed it. (Finding a
// connection's socket costs a pass over the process's descriptors: short requests, the
// most, finish before they are looked at.) The connections are looked at outside the lock,
// so watching and ending a request never wait on a pass, except a request whose own
// connection the pass is looking at.
//
// Threading: watch() from any thread; a Ticket is destroyed on its request's thread, and
// once its destructor returns the callback is not running and will not run. Callbacks run
// on the watch's thread with its lock held: they must be quick and must not watch().
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/http_server.h"

namespace cleave {

class ClientWatch {
 public:
  explicit ClientWatch(std::chrono::milliseconds period = std::chrono::milliseconds(200),
                       std::chrono::milliseconds settle = std::chrono::milliseconds(1000));
  ~ClientWatch();
  ClientWatch(const ClientWatch&) = delete;
  ClientWatch& operator=(const ClientWatch&) = delete;

  // Watching one response until destroyed.
  class Ticket {
   public:
    Ticket(Ticket&& other) noexcept : watch_(other.watch_), id_(other.id_) {
      other.watch_ = nullptr;
    }
    Ticket(const Ticket&) = delete;
    ~Ticket();

   private:
    friend class ClientWatch;
    Ticket(ClientWatch* watch, uint64_t id) : watch_(watch), id_(id) {}
    ClientWatch* watch_;
    uint64_t id_;
  };

  // Calls `gone` when `response`'s client has closed its connection, at most once, until
  // the ticket is destroyed. `response` must outlive the ticket.
  [[nodiscard]] Ticket watch(HttpResponse& response, std::function<void()> gone);

 private:
  struct Watched {
    HttpResponse* response;
    std::function<void()> gone;
    std::chrono::steady_clock::time_point since;
  };
  void run();

  const std::chrono::milliseconds period_, settle_;
  absl::Mutex mu_;
  std::map<uint64_t, Watched> watched_ ABSL_GUARDED_BY(mu_);
  // The ids whose connections the current pass looks at (their responses must stay).
  std::vector<uint64_t> looking_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // Last: started once the rest is.
};

}  // namespace cleave
