// A refusal's retry hint: how long the client should wait before sending the request again
// (a rate limit's refill, a full queue's turnover). Carried on an absl::Status as a payload;
// to gRPC clients as the trailing metadata grpc-retry-pushback-ms, which a channel's retry
// policy honors; the HTTP front turns it into Retry-After and retry-after-ms.
#pragma once

#include <chrono>
#include <optional>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace grpc {
class ClientContext;
class ServerContextBase;
}  // namespace grpc

namespace cleave {

inline constexpr char kRetryPushbackKey[] = "grpc-retry-pushback-ms";

// `status` (not OK) with the hint `after` (at least 1 ms).
absl::Status withRetryAfter(absl::Status status, std::chrono::milliseconds after);
// The hint `status` carries, if any.
std::optional<std::chrono::milliseconds> retryAfter(const absl::Status& status);
// The hint the server sent with a finished call's status, if any.
std::optional<std::chrono::milliseconds> retryAfter(const grpc::ClientContext& context);

// toGrpcStatus(status), its hint (if any) added to the call's trailing metadata.
grpc::Status toGrpcStatus(const absl::Status& status, grpc::ServerContextBase& context);

}  // namespace cleave
