#include "common/peer_socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <string>

namespace cleave {
namespace {

// The numeric address and port of `address`; false for a family other than IPv4/IPv6.
bool numeric(const sockaddr_storage& address, std::string& host, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(address);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof(text));
    port = ntohs(in.sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(address);
    inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof(text));
    port = ntohs(in6.sin6_port);
  } else {
    return false;
  }
  host = text;
  return true;
}

}  // namespace

int findConnectedSocket(std::string_view peer_address, int peer_port, int local_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_length = sizeof(peer), local_length = sizeof(local);
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0)
      continue;  // Not a socket, or not connected.
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_length) != 0)
      continue;
    std::string peer_host, local_host;
    int peer_at = 0, local_at = 0;
    if (numeric(peer, peer_host, peer_at) && numeric(local, local_host, local_at) &&
        peer_at == peer_port && local_at == local_port && peer_host == peer_address) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool peerClosed(int fd) {
  pollfd p{.fd = fd, .events = POLLRDHUP, .revents = 0};
  if (poll(&p, 1, 0) < 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace cleave
