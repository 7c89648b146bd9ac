// TLS for Cleave's gRPC endpoints, from PEM files. Errors name the flag and the file.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"

namespace cleave {

struct ServerTls {
  std::string cert_file;  // --tls-cert: this server's certificate chain.
  std::string key_file;   // --tls-key: its private key.
  // --tls-client-ca: when set, clients that present a certificate must be signed by it
  // (clients without one are still served; a service that needs one checks
  // peerHasVerifiedCert) — unless require_client_cert, when every client needs one.
  std::string client_ca_file;
  bool require_client_cert = false;
  bool enabled() const { return !cert_file.empty(); }
};

// Insecure credentials when `tls` is not enabled. Fails when only one of cert/key is set
// or a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> serverCredentials(const ServerTls& tls);

struct ClientTls {
  std::string ca_file;    // Verifies the server; empty: plaintext.
  std::string cert_file;  // This client's certificate (optional, with key_file).
  std::string key_file;
};

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> channelCredentials(const ClientTls& tls);

// True when the peer of `context` presented a certificate the server verified.
bool peerHasVerifiedCert(const grpc::ServerContext& context);

}  // namespace cleave
