// Conversions between absl::Status and grpc::Status (same code numbering).
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace cleave {

inline grpc::Status toGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status fromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace cleave
