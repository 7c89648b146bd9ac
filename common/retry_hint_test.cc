#include "common/retry_hint.h"

#include <gtest/gtest.h>

#include "common/grpc_status.h"

namespace cleave {
namespace {

using std::chrono::milliseconds;

TEST(RetryHintTest, ARefusalCarriesItsHintThroughCopies) {
  const absl::Status refused =
      withRetryAfter(absl::ResourceExhaustedError("full"), milliseconds(1234));
  const absl::Status copy = refused;  // NOLINT: the payload travels with the status.
  EXPECT_EQ(retryAfter(copy), milliseconds(1234));
  EXPECT_EQ(copy.message(), "full");
  EXPECT_EQ(retryAfter(absl::ResourceExhaustedError("full")), std::nullopt);
  // At least a millisecond: a hint of 0 would read as none.
  EXPECT_EQ(retryAfter(withRetryAfter(absl::UnavailableError("x"), milliseconds(0))),
            milliseconds(1));
  // OK has nothing to retry.
  EXPECT_TRUE(withRetryAfter(absl::OkStatus(), milliseconds(5)).ok());
  EXPECT_EQ(toGrpcStatus(refused).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

}  // namespace
}  // namespace cleave
