// What every Cleave binary sets up before anything else runs.
#pragma once

namespace cleave {

// Turns off absl::Mutex's lock-order checking, which some distributions' builds of absl
// leave on: it routes every lock through one process-wide graph (a point of contention
// between all threads) and aborts the process on a lock-order inversion that has not
// deadlocked. Unit tests keep it on, where an inversion should fail loudly.
void initProcess();

}  // namespace cleave
