// The socket of a TCP connection this process accepted, found by its addresses, and whether
// its peer has closed it. For servers whose library hides the socket (civetweb): noticing a
// client that went away while its response is still being computed.
//
// Threading: free functions; the fd must stay open while they use it (the connection's own
// thread holds it until its request is answered).
#pragma once

#include <string_view>

namespace cleave {

// The file descriptor of the connected socket whose peer is `peer_address`:`peer_port`
// (numeric, as inet_ntop writes it) and whose own port is `local_port`; -1 when none is
// (looks through /proc/self/fd: a few microseconds per descriptor).
int findConnectedSocket(std::string_view peer_address, int peer_port, int local_port);

// True once the peer of connected socket `fd` has closed the connection or reset it
// (POLLRDHUP: a half-closed connection counts as closed). Never blocks.
bool peerClosed(int fd);

}  // namespace cleave
