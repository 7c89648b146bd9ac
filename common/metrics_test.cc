#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "prometheus/counter.h"

namespace cleave {
namespace {

using ::testing::HasSubstr;

// A minimal HTTP/1.0 GET against 127.0.0.1; returns the whole response.
std::string httpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string response;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  close(fd);
  return response;
}

TEST(MetricsServerTest, ServesTheProcessRegistryOnAnEphemeralPort) {
  registerProcessMetrics("test");
  auto& requests = prometheus::BuildCounter()
                       .Name("cleave_test_requests_total")
                       .Help("test counter")
                       .Register(metricsRegistry())
                       .Add({{"code", "OK"}});
  requests.Increment(3);
  auto server = MetricsServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  std::string body = httpGet((*server)->port(), "/metrics");
  EXPECT_THAT(body, HasSubstr("200 OK"));
  EXPECT_THAT(body, HasSubstr("cleave_test_requests_total{code=\"OK\"} 3"));
  EXPECT_THAT(body, HasSubstr("cleave_build_info{"));
  EXPECT_THAT(body, HasSubstr("component=\"test\""));
  EXPECT_THAT(body, HasSubstr("cleave_process_start_time_seconds"));
}

TEST(MetricsServerTest, PortInUseIsAClearError) {
  auto first = MetricsServer::start("127.0.0.1", 0);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsServer::start("127.0.0.1", (*first)->port());
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("--metrics-port"));
  EXPECT_THAT(second.status().message(),
              HasSubstr("127.0.0.1:" + std::to_string((*first)->port())));
}

TEST(MetricsServerTest, OutOfRangePortIsRejected) {
  EXPECT_EQ(MetricsServer::start("127.0.0.1", 70000).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave
