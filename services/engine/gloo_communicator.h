// Gloo collectives over TCP on loopback between the rank threads of one process.
//
// Every rank thread of a group calls connect() on the same GlooRendezvous with its own rank;
// the calls block until the whole group has connected (or the timeout passes).
//
// Threading: GlooRendezvous is shared by the rank threads (its store is synchronized);
// each returned Communicator belongs to its rank thread.
#pragma once

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "services/engine/communicator.h"

namespace gloo::rendezvous {
class HashStore;
}

namespace cleave::engine {

class GlooRendezvous {
 public:
  GlooRendezvous(int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~GlooRendezvous();

  // Connects rank `rank` (0 <= rank < size) to every other rank.
  absl::StatusOr<std::unique_ptr<Communicator>> connect(int rank);

 private:
  int size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::rendezvous::HashStore> store_;
};

}  // namespace cleave::engine
