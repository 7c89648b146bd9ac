#include "services/router/router_server.h"
#include "common/grpc_keepalive.h"
#include "common/grpc_threads.h"

#include <unistd.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"

namespace cleave::router {

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::start(
    const RouterServerOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::unique_ptr<RouterServer> router(new RouterServer());
  // One id per router process: workers key token streams and reservations by it.
  WorkerPoolOptions workers = options.workers;
  if (workers.lost == nullptr) workers.lost = std::make_shared<LostWorkers>();
  workers.router_id = absl::StrCat("router-", getpid(), "-", std::random_device{}() % 100000);
  router->relay_ = std::make_unique<TokenRelay>(workers.router_id, workers.lost);
  TokenRelay* relay = router->relay_.get();
  router->pool_ = std::make_unique<WorkerPool>(
      workers, [relay](std::shared_ptr<const Worker> w) { relay->addWorker(std::move(w)); },
      [relay](const std::string& id) { relay->removeWorker(id); });
  router->service_ = std::make_unique<GenerationService>(options.generation, *router->pool_, *relay,
                                                         options.tokenizer);
  router->registry_ =
      std::make_unique<RegistryService>(*router->pool_, !options.tls.client_ca_file.empty());
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      serverCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  grpc::ServerBuilder builder;
  int port = 0;
  // Without this, Linux lets a second server share the port and steal half the calls.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  keepServerThreads(builder);
  useKeepalive(builder);
  builder.AddListeningPort(options.listen_address, *credentials, &port);
  builder.RegisterService(router->service_.get());
  builder.RegisterService(router->registry_.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address,
                     ": the port may be in use or the address malformed; pass another --listen "
                     "(host:port, port 0 picks a free one)"));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  server->GetHealthCheckService()->SetServingStatus(v1::Generation::service_full_name(), true);
  router->server_ = std::move(server);
  router->port_ = port;
  return router;
}

std::shared_ptr<grpc::Channel> RouterServer::inProcessChannel() {
  return server_->InProcessChannel(grpc::ChannelArguments());
}

RouterServer::~RouterServer() { shutdown(std::chrono::milliseconds(0)); }

void RouterServer::shutdown(std::chrono::milliseconds grace) {
  if (server_ == nullptr) return;
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
  server_.reset();
}

}  // namespace cleave::router
