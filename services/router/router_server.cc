#include "services/router/router_server.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"

namespace cleave::router {

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::start(
    const RouterServerOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  auto service = std::make_unique<GenerationService>(options.generation);
  grpc::ServerBuilder builder;
  int port = 0;
  // Without this, Linux lets a second server share the port and steal half the calls.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen_address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address,
                     ": the port may be in use or the address malformed; pass another --listen "
                     "(host:port, port 0 picks a free one)"));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  server->GetHealthCheckService()->SetServingStatus(v1::Generation::service_full_name(), true);
  return std::unique_ptr<RouterServer>(
      new RouterServer(std::move(service), std::move(server), port));
}

RouterServer::RouterServer(std::unique_ptr<GenerationService> service,
                           std::unique_ptr<grpc::Server> server, int port)
    : service_(std::move(service)), server_(std::move(server)), port_(port) {}

RouterServer::~RouterServer() { shutdown(std::chrono::milliseconds(0)); }

void RouterServer::shutdown(std::chrono::milliseconds grace) {
  if (server_ == nullptr) return;
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
  server_.reset();
}

}  // namespace cleave::router
