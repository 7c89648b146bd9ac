// Keeps a worker registered with its router (proto/cleave/v1/worker.proto, Registry):
// registers at start — retrying until the router answers, so the two may start in any
// order — heartbeats its load, registers again when the router asks, and deregisters on
// stop. A registration the router refuses (an incompatible model or KV layout) is logged
// with the router's reason and retried, never silently dropped.
//
// Threading: start() and the destructor on the owning thread; the work runs on a
// background thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "cleave/v1/worker.grpc.pb.h"
#include "common/service_thread.h"
#include "grpcpp/security/credentials.h"

namespace cleave::worker {

class RouterRegistration {
 public:
  // `load` is called from the background thread before each heartbeat, with the id of the
  // router registered with (RegisterResponse.router_id).
  // `credentials` for the channel to the router (TLS, with a client certificate when the
  // router asks workers for one).
  RouterRegistration(const std::string& router_address,
                     std::shared_ptr<grpc::ChannelCredentials> credentials,
                     v1::RegisterRequest request,
                     std::function<v1::LoadSnapshot(const std::string& router_id)> load);
  ~RouterRegistration();  // Deregisters (best effort) and stops.

  // Tells the router at once (and in every heartbeat after) that this worker takes no new
  // work. Best effort: an error is logged.
  void drain();

 private:
  void run(std::stop_token stop);

  std::unique_ptr<v1::Registry::Stub> stub_;
  v1::RegisterRequest request_;
  std::function<v1::LoadSnapshot(const std::string& router_id)> load_;
  std::atomic<bool> draining_{false};
  ServiceThread thread_{"registration"};
};

}  // namespace cleave::worker
