// Flags every Cleave server shares: where it serves gRPC and metrics, and its ready file.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/flags.h"

namespace cleave {

struct ServerFlags {
  // gRPC address host:port; port 0 picks a free port.
  std::string listen;
  std::string metrics_address = "127.0.0.1";
  // 0 picks a free port.
  int64_t metrics_port = 0;
  // When serving, {"grpc_port": P, "metrics_port": M} is written here (empty: nowhere).
  std::string ready_file;

  // Binds --listen, --metrics-address, --metrics-port and --ready-file.
  void addTo(FlagSet& flags);
  // Checks ranges; the message names the flag.
  absl::Status validate() const;
};

}  // namespace cleave
