// Collectives between the rank threads of one process through their shared address space:
// each rank publishes a pointer to its buffer, and after a barrier the ranks read each
// other's buffers directly. An all-reduce is two barriers and one pass over the data: rank r
// sums slice r of every rank's buffer and writes the sum back into slice r of each (slice r
// of any buffer is only ever touched by rank r).
//
// On a CPU this is what tensor parallelism between rank threads wants: a decode step
// issues two all-reduces per layer of a few kilobytes, where a round trip through TCP
// (gloo_communicator.h) costs a few hundred microseconds and this a few.
//
// Barriers spin briefly, then yield. A rank that never arrives stalls the others; ranks
// fail before a step's first collective (validation is the same on every rank), never
// between two.
//
// Threading: the group is shared by its rank threads; each Communicator belongs to one.
#pragma once

#include <memory>
#include <vector>

#include "services/engine/communicator.h"

namespace cleave::engine {

class SharedMemoryGroup {
 public:
  explicit SharedMemoryGroup(int size);
  ~SharedMemoryGroup();

  // The communicator of rank `rank` (0 <= rank < size), to be used by that rank's thread.
  std::unique_ptr<Communicator> communicator(int rank);

  struct State;  // The slots and the barrier; shared with the communicators.

 private:
  std::shared_ptr<State> state_;
};

}  // namespace cleave::engine
