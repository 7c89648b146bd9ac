// Clean shutdown on SIGINT / SIGTERM for long-running binaries.
//
// Call blockShutdownSignals() first thing in main(), before any thread starts, so every
// thread inherits the blocked mask; later waitForShutdownSignal() (or a ShutdownWatcher)
// receives the signal synchronously instead of in an async handler.
#pragma once

#include <chrono>
#include <optional>

namespace cleave {

void blockShutdownSignals();

// Blocks until SIGINT or SIGTERM arrives (or `timeout` passes). Returns the signal number,
// or nullopt on timeout.
std::optional<int> waitForShutdownSignal(
    std::optional<std::chrono::milliseconds> timeout = std::nullopt);

// What a server's main thread does until SIGINT or SIGTERM: waits, and every `period`
// hands the heap's free pages back to the operating system (glibc keeps what threads free
// in per-thread arenas; under gRPC's changing thread pool that retained memory creeps up
// although the live heap stays flat). Returns the signal number.
int serveUntilShutdownSignal(std::chrono::milliseconds period = std::chrono::seconds(30));

}  // namespace cleave
