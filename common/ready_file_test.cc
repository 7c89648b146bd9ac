#include "common/ready_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace cleave {
namespace {

TEST(ReadyFileTest, WritesOneJsonObject) {
  std::string path = testing::TempDir() + "/ready_file_test.json";
  ASSERT_TRUE(writeReadyFile(path, {{"grpc_port", 5123}, {"metrics_port", 9321}}).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "{\"grpc_port\": 5123, \"metrics_port\": 9321}\n");
}

TEST(ReadyFileTest, UnwritablePathIsAnErrorNamingIt) {
  absl::Status status = writeReadyFile("/nonexistent-dir/ready.json", {{"a", 1}});
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("/nonexistent-dir/ready.json"), std::string_view::npos);
}

}  // namespace
}  // namespace cleave
