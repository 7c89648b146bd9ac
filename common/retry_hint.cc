#include "common/retry_hint.h"

#include <algorithm>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"

namespace cleave {
namespace {

constexpr char kPayload[] = "type.cleave/retry-after-ms";

std::optional<std::chrono::milliseconds> parseMs(absl::string_view text) {
  int64_t ms = 0;
  if (!absl::SimpleAtoi(text, &ms) || ms < 0) return std::nullopt;
  return std::chrono::milliseconds(ms);
}

}  // namespace

absl::Status withRetryAfter(absl::Status status, std::chrono::milliseconds after) {
  if (status.ok()) return status;
  status.SetPayload(kPayload, absl::Cord(absl::StrCat(std::max<int64_t>(1, after.count()))));
  return status;
}

std::optional<std::chrono::milliseconds> retryAfter(const absl::Status& status) {
  const auto payload = status.GetPayload(kPayload);
  if (!payload) return std::nullopt;
  return parseMs(std::string(*payload));
}

std::optional<std::chrono::milliseconds> retryAfter(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kRetryPushbackKey);
  if (it == trailers.end()) return std::nullopt;
  return parseMs(absl::string_view(it->second.data(), it->second.size()));
}

grpc::Status toGrpcStatus(const absl::Status& status, grpc::ServerContextBase& context) {
  if (std::optional<std::chrono::milliseconds> after = retryAfter(status)) {
    context.AddTrailingMetadata(kRetryPushbackKey, absl::StrCat(after->count()));
  }
  return toGrpcStatus(status);
}

}  // namespace cleave
