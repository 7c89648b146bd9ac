#include "services/router/api_keys.h"

#include "common/retry_hint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <thread>

namespace cleave::router {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAlpha[] = "alpha-0123456789abcdef";
constexpr char kBeta[] = "beta-fedcba9876543210";

class ApiKeysTest : public ::testing::Test {
 protected:
  void write(const std::string& text) { std::ofstream(path_) << text; }
  void TearDown() override { std::remove(path_.c_str()); }
  std::string path_ = ::testing::TempDir() + "/api_keys_test.txt";
};

TEST_F(ApiKeysTest, AcceptsListedKeysByNameAndRefusesTheRest) {
  write(std::string("# keys\nteam-a ") + kAlpha + "\n\n" + kBeta + "\n");
  auto keys = ApiKeys::load(path_);
  ASSERT_TRUE(keys.ok()) << keys.status();
  auto a = (*keys)->checkHeader(std::string("Bearer ") + kAlpha);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, "team-a");
  auto b = (*keys)->checkHeader(std::string("Bearer ") + kBeta);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, "line 4");
  for (const std::string& bad :
       {std::string(""), std::string(kAlpha), std::string("Bearer ") + kAlpha + "x",
        std::string("Bearer alpha-0123456789abcdeF"), std::string("Basic ") + kAlpha}) {
    auto r = (*keys)->checkHeader(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(r.status().message(), Not(HasSubstr(kAlpha)));
  }
}

TEST_F(ApiKeysTest, ReloadsWhenTheFileChangesAndKeepsGoodKeysOnABadOne) {
  write(std::string(kAlpha) + "\n" + kBeta + "\n");
  auto keys = ApiKeys::load(path_);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_TRUE((*keys)->checkHeader(std::string("Bearer ") + kAlpha).ok());
  write(std::string(kBeta) + "\n");  // Alpha revoked (the size changed).
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_FALSE((*keys)->checkHeader(std::string("Bearer ") + kAlpha).ok());
  EXPECT_TRUE((*keys)->checkHeader(std::string("Bearer ") + kBeta).ok());
  write("# nothing left\n");  // No key: the last good set stays.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_TRUE((*keys)->checkHeader(std::string("Bearer ") + kBeta).ok());
}

TEST_F(ApiKeysTest, EachKeyHasItsOwnRate) {
  write(std::string("a ") + kAlpha + "\nb " + kBeta + "\n");
  auto keys = ApiKeys::load(path_, /*rate_per_second=*/2);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_TRUE((*keys)->takeRequest("a").ok());  // A burst of one second's worth: 2.
  EXPECT_TRUE((*keys)->takeRequest("a").ok());
  absl::Status over = (*keys)->takeRequest("a");
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("'a' is over its rate of 2 requests/s"));
  // The hint: until the bucket holds a request again, at most half a second at 2/s.
  const std::optional<std::chrono::milliseconds> after = retryAfter(over);
  ASSERT_TRUE(after.has_value());
  EXPECT_GT(after->count(), 250);
  EXPECT_LE(after->count(), 500);
  EXPECT_TRUE((*keys)->takeRequest("b").ok());                  // Another key is not affected.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // Refills one.
  EXPECT_TRUE((*keys)->takeRequest("a").ok());
  auto unlimited = ApiKeys::load(path_);
  ASSERT_TRUE(unlimited.ok());
  for (int i = 0; i < 100; ++i) ASSERT_TRUE((*unlimited)->takeRequest("a").ok());
}

TEST_F(ApiKeysTest, BadFilesAreRefusedNamingTheLine) {
  EXPECT_THAT(ApiKeys::load("/nonexistent/keys").status().message(), HasSubstr("cannot read"));
  write("# only a comment\n");
  EXPECT_THAT(ApiKeys::load(path_).status().message(), HasSubstr("holds no key"));
  write("short\n");
  EXPECT_THAT(ApiKeys::load(path_).status().message(), HasSubstr(":1: a key must have"));
  write(std::string("a b ") + kAlpha + "\n");
  EXPECT_THAT(ApiKeys::load(path_).status().message(), HasSubstr(":1 has 3 fields"));
}

}  // namespace
}  // namespace cleave::router
