#include "common/process_init.h"

#include "absl/synchronization/mutex.h"

namespace cleave {

void initProcess() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

}  // namespace cleave
