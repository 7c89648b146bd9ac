// A real HTTP server and raw client sockets: a client that closes its connection while its
// response is being computed is noticed (once); one that waits is not.
#include "common/client_watch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/peer_socket.h"
#include "gtest/gtest.h"

namespace cleave {
namespace {

int connectTo(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  return fd;
}

void sendRequest(int fd, const std::string& path) {
  const std::string request = "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
  ASSERT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
}

TEST(ClientWatchTest, AClientThatClosesIsNoticedOnceAndOneThatWaitsIsNot) {
  ClientWatch watch(std::chrono::milliseconds(20), std::chrono::milliseconds(50));
  std::atomic<int> calls{0};
  absl::Notification handled;
  std::atomic<bool> noticed{false};
  auto server =
      HttpServer::start({.listen = "127.0.0.1:0", .threads = 4},
                        [&](const HttpRequest& request, HttpResponse& response) {
                          absl::Notification gone;
                          {
                            ClientWatch::Ticket ticket = watch.watch(response, [&] {
                              ++calls;
                              gone.Notify();
                            });
                            // A computation that takes a while: up to 3 s, or until the client is
                            // gone.
                            noticed = gone.WaitForNotificationWithTimeout(
                                absl::Milliseconds(request.path == "/closes" ? 3000 : 400));
                          }
                          response.send(200, "text/plain", "done");
                          if (request.path == "/closes") handled.Notify();
                        });
  ASSERT_TRUE(server.ok()) << server.status();

  const int waits = connectTo((*server)->port());
  sendRequest(waits, "/waits");
  std::string answer;
  char buffer[512];
  for (ssize_t n;
       answer.find("done") == std::string::npos && (n = read(waits, buffer, sizeof(buffer))) > 0;) {
    answer.append(buffer, static_cast<size_t>(n));
  }
  EXPECT_NE(answer.find("done"), std::string::npos) << answer;
  EXPECT_FALSE(noticed.load());
  close(waits);

  const int closes = connectTo((*server)->port());
  sendRequest(closes, "/closes");
  absl::SleepFor(absl::Milliseconds(100));  // The handler is computing.
  close(closes);
  ASSERT_TRUE(handled.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(noticed.load());
  EXPECT_EQ(calls.load(), 1);
}

// A response whose connection check blocks until released (as a pass over many descriptors
// takes long): it counts how often it was looked at.
class SlowResponse final : public HttpResponse {
 public:
  void send(int, std::string_view, std::string_view,
            const std::vector<std::pair<std::string, std::string>>&) override {}
  bool startStream(int, std::string_view,
                   const std::vector<std::pair<std::string, std::string>>&) override {
    return false;
  }
  bool write(std::string_view) override { return false; }
  void endStream() override {}
  bool clientGone() override {
    looking.Notify();
    release.WaitForNotification();
    return false;
  }
  absl::Notification looking, release;
};

// While a pass looks at one slow connection, other requests are watched and end without
// waiting for it; the slow one's own ticket waits until the pass is done with its response.
TEST(ClientWatchTest, APassLooksAtConnectionsOutsideTheLock) {
  ClientWatch watch(std::chrono::milliseconds(5), std::chrono::milliseconds(0));
  SlowResponse slow, other;
  other.release.Notify();
  std::optional<ClientWatch::Ticket> slow_ticket(watch.watch(slow, [] {}));
  ASSERT_TRUE(slow.looking.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::Notification others_done;
  std::thread others([&] {
    for (int i = 0; i < 100; ++i) ClientWatch::Ticket t = watch.watch(other, [] {});
    others_done.Notify();
  });
  // With the pass holding the lock, these would wait for the slow check to end.
  const bool quick = others_done.WaitForNotificationWithTimeout(absl::Seconds(10));
  std::atomic<bool> ended{false};
  std::thread ending([&] {
    slow_ticket.reset();
    ended = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  const bool ended_early = ended.load();  // Its response is still being looked at.
  slow.release.Notify();
  others.join();
  ending.join();
  EXPECT_TRUE(quick);
  EXPECT_FALSE(ended_early);
  EXPECT_TRUE(ended.load());
}

TEST(PeerSocketTest, OnlyTheConnectionsOwnAddressesFindIt) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  socklen_t length = sizeof(address);
  getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin_port);
  const int client = connectTo(port);
  const int accepted = accept(listener, nullptr, nullptr);
  sockaddr_in peer{};
  length = sizeof(peer);
  getpeername(accepted, reinterpret_cast<sockaddr*>(&peer), &length);
  const int peer_port = ntohs(peer.sin_port);
  EXPECT_EQ(findConnectedSocket("127.0.0.1", peer_port, port), accepted);
  EXPECT_EQ(findConnectedSocket("127.0.0.2", peer_port, port), -1);
  EXPECT_EQ(findConnectedSocket("127.0.0.1", peer_port, port + 1), -1);
  EXPECT_FALSE(peerClosed(accepted));
  close(client);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(peerClosed(accepted));
  close(accepted);
  close(listener);
}

}  // namespace
}  // namespace cleave
