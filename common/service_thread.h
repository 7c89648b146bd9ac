// A named background thread that runs one loop until asked to stop.
//
// Threading contract: start() and stop() are called from the owning thread (never from the
// loop itself). The body receives a std::stop_token and must return promptly once a stop is
// requested; sleepFor() is the interruptible wait it should use between iterations.
// stop() requests the stop and joins; it is idempotent and the destructor calls it.
#pragma once

#include <chrono>
#include <functional>
#include <stop_token>
#include <string>
#include <thread>

namespace cleave {

class ServiceThread {
 public:
  explicit ServiceThread(std::string name) : name_(std::move(name)) {}
  ~ServiceThread() { stop(); }
  ServiceThread(const ServiceThread&) = delete;
  ServiceThread& operator=(const ServiceThread&) = delete;

  // Starts the thread running `body`. Must not already be running.
  void start(std::function<void(std::stop_token)> body);
  // Requests a stop and waits for the body to return.
  void stop();
  bool running() const { return thread_.joinable(); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::jthread thread_;
};

// Sleeps for `duration` or until a stop is requested on `token`, whichever comes first.
// Returns true when the full duration elapsed, false when woken by the stop request.
bool sleepFor(std::stop_token token, std::chrono::nanoseconds duration);

}  // namespace cleave
