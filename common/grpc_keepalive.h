// Keepalive between the router and its workers, both ways. A peer that stops answering
// while its connection stays open (a host gone without closing it, a process stopped or
// hung) ends the connection within about kKeepaliveTimeMs + kKeepaliveTimeoutMs: a caller's
// calls in flight fail with UNAVAILABLE (the router sends a prompt to another prefill worker
// instead of waiting until the request's deadline, forever for one without), and a
// server's are cancelled (a prefill for a router gone stops writing).
//
// A peer restarted at its address is dialled again within about kMaxReconnectMs (gRPC's
// default backoff grows to two minutes): a worker joins a restarted router before its lease
// for the old router's sequences ends.
#pragma once

#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

namespace cleave {

inline constexpr int kKeepaliveTimeMs = 10000;    // A ping after this long...
inline constexpr int kKeepaliveTimeoutMs = 5000;  // ...unanswered this long ends the link.
inline constexpr int kMaxReconnectMs = 1000;

// For a channel to a peer that allows the pings (below).
inline grpc::ChannelArguments keepaliveChannelArguments() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kMaxReconnectMs / 4);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectMs);
  return args;
}

// A server accepts those pings from idle callers too (by default it answers pings more often
// than every two hours without a call by closing the connection), and pings its callers the
// same way while they have calls in flight. It never pings an idle caller: a client may not
// read its socket between calls (Python's grpcio does not), and closing its connection after
// the unanswered ping would fail its next call with UNAVAILABLE ("Broken pipe").
inline void useKeepalive(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);  // 0: any number
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
}

}  // namespace cleave
