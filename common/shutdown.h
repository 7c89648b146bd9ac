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

}  // namespace cleave
