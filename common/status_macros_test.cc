#include "common/status_macros.h"

#include <gtest/gtest.h>

namespace cleave {
namespace {

absl::StatusOr<int> half(int x) {
  if (x % 2) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> quarter(int x) {
  CLEAVE_ASSIGN_OR_RETURN(int h, half(x));
  CLEAVE_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}

absl::Status checkEven(int x) {
  CLEAVE_RETURN_IF_ERROR(half(x).status());
  return absl::OkStatus();
}

TEST(StatusMacrosTest, PropagateErrorsAndValues) {
  EXPECT_EQ(*quarter(12), 3);
  EXPECT_EQ(quarter(6).status().message(), "odd");
  EXPECT_EQ(quarter(7).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(checkEven(4).ok());
  EXPECT_FALSE(checkEven(5).ok());
}

}  // namespace
}  // namespace cleave
