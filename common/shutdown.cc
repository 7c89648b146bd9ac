#include "common/shutdown.h"

#include <signal.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cerrno>
#include <ctime>

#include "common/log.h"

namespace cleave {
namespace {

sigset_t shutdownSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void blockShutdownSignals() {
  sigset_t set = shutdownSet();
  CLEAVE_CHECK(pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0);
}

std::optional<int> waitForShutdownSignal(std::optional<std::chrono::milliseconds> timeout) {
  sigset_t set = shutdownSet();
  while (true) {
    int signal = 0;
    if (!timeout) {
      if (sigwait(&set, &signal) == 0) return signal;
      continue;
    }
    timespec wait{};
    wait.tv_sec = timeout->count() / 1000;
    wait.tv_nsec = (timeout->count() % 1000) * 1000000;
    signal = sigtimedwait(&set, nullptr, &wait);
    if (signal > 0) return signal;
    if (errno == EAGAIN) return std::nullopt;
    // EINTR: another signal interrupted the wait; wait again.
  }
}

int serveUntilShutdownSignal(std::chrono::milliseconds period) {
  while (true) {
    if (std::optional<int> signal = waitForShutdownSignal(period)) return *signal;
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
  }
}

}  // namespace cleave
