#include "common/server_flags.h"

#include "absl/strings/str_cat.h"

namespace cleave {

void ServerFlags::addTo(FlagSet& flags) {
  flags.addString("listen", &listen, "gRPC address host:port (port 0 picks a free port)");
  flags.addString("metrics-address", &metrics_address, "Address the /metrics endpoint binds");
  flags.addInt("metrics-port", &metrics_port, "Port of the /metrics endpoint (0 picks one)");
  flags.addString("ready-file", &ready_file,
                  "When serving, write {\"grpc_port\": P, \"metrics_port\": M} here");
}

absl::Status ServerFlags::validate() const {
  if (metrics_port < 0 || metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port must be in 0..65535 (0 picks one), got ", metrics_port));
  }
  if (listen.empty()) return absl::InvalidArgumentError("--listen must be host:port");
  return absl::OkStatus();
}

}  // namespace cleave
