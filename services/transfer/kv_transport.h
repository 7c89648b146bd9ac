// Moving KV blocks between workers: one-sided writes into memory a peer registered.
//
// Shaped like NIXL: a worker registers its KV pool once and publishes the key a writer
// needs; a writer posts a list of writes into a peer's region and polls the transfer until
// it is complete, which includes a flush — when poll() says done, the bytes are visible at
// the target. Connections and imported keys are cached per peer.
//
// Implementations: UCX (ucx_transport.cc, across processes and hosts) and loopback
// (loopback_transport.cc, in one process, for tests of the code above it).
//
// Threading: a transport is thread-safe; a Transfer is polled by the thread that posted it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace cleave::transfer {

struct Capabilities {
  std::string name;  // "ucx", "loopback"
  bool cross_process = false;
};

// Where a peer lets us write: its address, the region's base and key.
struct RemoteRegion {
  std::string peer_address;
  uint64_t base = 0;
  std::string key;
  uint64_t bytes = 0;
};

struct Write {
  const void* local = nullptr;
  uint64_t remote_offset = 0;  // From RemoteRegion::base.
  uint64_t bytes = 0;
};

class Transfer {
 public:
  virtual ~Transfer() = default;
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  virtual Capabilities capabilities() const = 0;
  // This endpoint's address, for peers to write from.
  virtual std::string address() const = 0;
  // Lets peers write into [base, base + bytes) until the transport is destroyed; returns
  // the key they need.
  virtual absl::StatusOr<std::string> registerMemory(void* base, uint64_t bytes) = 0;
  // Starts `writes` into `target`. InvalidArgument for a write outside the region;
  // Unavailable when the peer cannot be reached.
  virtual absl::StatusOr<std::unique_ptr<Transfer>> post(const RemoteRegion& target,
                                                         std::span<const Write> writes) = 0;
  // Drives progress: true once every write of `transfer` is complete at the target.
  virtual absl::StatusOr<bool> poll(Transfer& transfer) = 0;
  // Gives up on `transfer`: once this returns, none of its writes moves data from this side
  // any more (its connection to the peer is closed, cancelling what was outstanding), so the
  // rows it read can be reused and the peer can hand its target rows to another transfer.
  // Harmless on a transfer that completed.
  virtual void abandon(Transfer& transfer) = 0;
};

// A UCX (ucp) transport with its own context and worker. Unavailable when UCX cannot
// start here.
absl::StatusOr<std::unique_ptr<KvTransport>> makeUcxTransport();
// A transport whose peers are other loopback transports of this process.
std::unique_ptr<KvTransport> makeLoopbackTransport();

// Posts `writes` and polls until done, `timeout` passes (DeadlineExceeded) or `stop` (may
// be empty) turns true (Aborted); an unfinished transfer is abandoned, so none of its writes
// lands after the return.
absl::Status writeAndWait(KvTransport& transport, const RemoteRegion& target,
                          std::span<const Write> writes, std::chrono::milliseconds timeout,
                          const std::function<bool()>& stop = {});

}  // namespace cleave::transfer
