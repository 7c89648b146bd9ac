// How Cleave's synchronous gRPC servers keep their threads.
//
// A sync server runs every call on a thread of its pool and, by default, lets a thread
// exit as soon as more than two are idle. Under streaming load that means a steady churn
// of threads created and destroyed (14 new threads in 20 s at 8 streams, measured on the
// router), each with a fresh stack and allocator state: CPU spent for nothing, and
// resident memory that creeps up although the live heap stays flat. Keeping up to
// kIdleThreads idle threads stops the churn at the loads a router or worker sees.
#pragma once

#include <grpcpp/server_builder.h>

namespace cleave {

inline constexpr int kIdleThreads = 64;

inline void keepServerThreads(grpc::ServerBuilder& builder) {
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, kIdleThreads);
}

}  // namespace cleave
