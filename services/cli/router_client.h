// C++ client of a Cleave router (cleave.v1.Generation).
//
// Threading: a RouterClient may be shared by threads; each call is independent.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cleave/v1/generation.grpc.pb.h"

namespace cleave::client {

struct RouterClientOptions {
  // host:port of the router.
  std::string address;
  // Deadline applied to each unary call.
  std::chrono::milliseconds timeout{10000};
  // Sent as 'authorization: Bearer KEY' on every call when non-empty; empty takes the
  // CLEAVE_API_KEY environment variable.
  std::string api_key;
  // The router's CA (PEM file) to reach it over TLS; empty takes CLEAVE_TLS_CA, and
  // neither means plaintext.
  std::string tls_ca;
};

class RouterClient {
 public:
  explicit RouterClient(RouterClientOptions options);

  // Waits until the channel is connected or the timeout passes.
  absl::Status waitUntilConnected();
  absl::StatusOr<v1::GetServerInfoResponse> serverInfo();
  absl::StatusOr<v1::ListModelsResponse> listModels();
  // Streams one generation: `on_message` sees every response in order (returning false
  // cancels the call). The call's deadline is `timeout` from now. Returns the stream's
  // status (OK after the message carrying `final`).
  absl::Status generate(const v1::GenerateRequest& request,
                        const std::function<bool(const v1::GenerateResponse&)>& on_message,
                        std::chrono::milliseconds timeout);

 private:
  std::unique_ptr<grpc::ClientContext> newContext() const;
  void authorize(grpc::ClientContext& context) const;

  RouterClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

}  // namespace cleave::client
