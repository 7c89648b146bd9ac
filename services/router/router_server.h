// The router's gRPC server: the Generation service for clients, the Registry service for
// workers, the standard health service (grpc.health.v1) and server reflection.
//
// Threading: start() and shutdown() are called from one owning thread.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tls.h"
#include "services/router/generation_service.h"
#include "services/router/registry_service.h"
#include "services/router/token_relay.h"
#include "services/router/worker_pool.h"

namespace grpc {
class Channel;
class Server;
}  // namespace grpc

namespace cleave::router {

struct RouterServerOptions {
  // host:port to serve on; port 0 picks a free port.
  std::string listen_address = "127.0.0.1:50051";
  GenerationServiceOptions generation;
  WorkerPoolOptions workers;
  // The served model's tokenizer (null: only token-id prompts).
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer;
  // TLS on the port; with a client CA, the Registry serves only workers that present a
  // certificate signed by it.
  ServerTls tls;
};

class RouterServer {
 public:
  // Builds and starts the server. Fails with a message naming the address when it cannot
  // listen there (port in use, no permission, malformed address).
  static absl::StatusOr<std::unique_ptr<RouterServer>> start(const RouterServerOptions& options);
  ~RouterServer();

  // The port actually bound.
  int port() const { return port_; }
  // Stops accepting calls, lets running calls end within `grace`, then cancels them.
  void shutdown(std::chrono::milliseconds grace);
  WorkerPool& workers() { return *pool_; }
  // A channel to this server's services without a socket (for the HTTP API); calls on it
  // pass the same interceptors, authentication and admission as remote ones.
  std::shared_ptr<grpc::Channel> inProcessChannel();

 private:
  RouterServer() = default;

  // Destroyed bottom-up: the server first, then what its handlers use.
  std::unique_ptr<TokenRelay> relay_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<GenerationService> service_;
  std::unique_ptr<RegistryService> registry_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace cleave::router
