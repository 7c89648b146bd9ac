#include "services/cli/router_client.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"

namespace cleave::client {
namespace {

RouterClientOptions withEnvironment(RouterClientOptions options) {
  if (const char* key = std::getenv("CLEAVE_API_KEY"); options.api_key.empty() && key != nullptr) {
    options.api_key = key;
  }
  if (const char* ca = std::getenv("CLEAVE_TLS_CA"); options.tls_ca.empty() && ca != nullptr) {
    options.tls_ca = ca;
  }
  return options;
}

// The channel's credentials. A CA file that cannot be read is a usage error of the command
// line that named it: the program stops with the reason (status 2).
std::shared_ptr<grpc::ChannelCredentials> credentialsFor(const RouterClientOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      channelCredentials({.ca_file = options.tls_ca});
  if (credentials.ok()) return *credentials;
  std::fprintf(stderr, "cleave: %s\n", std::string(credentials.status().message()).c_str());
  std::exit(2);
}

}  // namespace

RouterClient::RouterClient(RouterClientOptions options)
    : options_(withEnvironment(std::move(options))),
      channel_(grpc::CreateChannel(options_.address, credentialsFor(options_))),
      stub_(v1::Generation::NewStub(channel_)) {}

std::unique_ptr<grpc::ClientContext> RouterClient::newContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + options_.timeout);
  authorize(*context);
  return context;
}

void RouterClient::authorize(grpc::ClientContext& context) const {
  if (!options_.api_key.empty()) context.AddMetadata("authorization", "Bearer " + options_.api_key);
}

absl::Status RouterClient::waitUntilConnected() {
  if (channel_->WaitForConnected(std::chrono::system_clock::now() + options_.timeout)) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat("no router answers at ", options_.address, " (waited ",
                                             options_.timeout.count(),
                                             " ms); check --router and that it is running"));
}

absl::StatusOr<v1::GetServerInfoResponse> RouterClient::serverInfo() {
  v1::GetServerInfoResponse response;
  auto context = newContext();
  grpc::Status status = stub_->GetServerInfo(context.get(), {}, &response);
  if (!status.ok()) return fromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::ListModelsResponse> RouterClient::listModels() {
  v1::ListModelsResponse response;
  auto context = newContext();
  grpc::Status status = stub_->ListModels(context.get(), {}, &response);
  if (!status.ok()) return fromGrpcStatus(status);
  return response;
}

absl::Status RouterClient::generate(
    const v1::GenerateRequest& request,
    const std::function<bool(const v1::GenerateResponse&)>& on_message,
    std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  authorize(context);
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> stream =
      stub_->Generate(&context, request);
  v1::GenerateResponse message;
  while (stream->Read(&message)) {
    if (!on_message(message)) {
      context.TryCancel();
      break;
    }
  }
  return fromGrpcStatus(stream->Finish());
}

}  // namespace cleave::client
