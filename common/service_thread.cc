#include "common/service_thread.h"

#include <pthread.h>

#include <condition_variable>
#include <mutex>

#include "common/log.h"

namespace cleave {

void ServiceThread::start(std::function<void(std::stop_token)> body) {
  CLEAVE_CHECK(!thread_.joinable()) << "thread " << name_ << " started twice";
  thread_ = std::jthread([name = name_, body = std::move(body)](std::stop_token token) {
    // Linux limits thread names to 15 characters.
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    body(token);
  });
}

void ServiceThread::stop() {
  if (!thread_.joinable()) return;
  thread_.request_stop();
  thread_.join();
}

bool sleepFor(std::stop_token token, std::chrono::nanoseconds duration) {
  std::mutex mutex;
  std::condition_variable_any wake;
  std::unique_lock lock(mutex);
  wake.wait_for(lock, token, duration, [] { return false; });
  return !token.stop_requested();
}

}  // namespace cleave
