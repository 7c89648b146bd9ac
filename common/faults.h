// Fault injection for tests: compiled in, off unless the CLEAVE_FAULTS environment variable
// is set when the process starts, e.g.
//
//   CLEAVE_FAULTS="kv_send_fail=1,kv_send_delay_ms=500,heartbeat_stall_ms=3000"
//   CLEAVE_FAULTS="crash_at=prefill_before_kv_send"
//
// A counted fault (`kv_send_fail=2`) fires that many times; a value (`..._ms=500`) is read
// each time; `crash_at=POINT` ends the process at once (exit status 86, no cleanup, as a
// crash would) the first time it reaches POINT. docs/reliability.md lists the points.
//
// Threading: every function may be called from any thread.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

namespace cleave::faults {

// True (and one count used up) while counted fault `name` has counts left.
bool fire(absl::string_view name);
// The value of `name`; 0 when it is not set.
int64_t value(absl::string_view name);
// Sleeps value(name) milliseconds, if set.
void delay(absl::string_view name);
// Ends the process when CLEAVE_FAULTS says crash_at=`point`.
void crashPoint(absl::string_view point);
// Ends the process now, as a crash would (exit status 86, no cleanup).
[[noreturn]] void crash(absl::string_view why);

}  // namespace cleave::faults
