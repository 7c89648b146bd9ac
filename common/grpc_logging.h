// Routes gRPC's internal log lines into Cleave's log at DEBUG level.
//
// gRPC reports failures we already turn into clear Status messages (a port in use, a peer
// gone) with its own multi-line dumps; those stay available with --log-level=debug.
// Call once at the start of main(), before any gRPC object exists.
#pragma once

namespace cleave {

void routeGrpcLogsToDebug();

}  // namespace cleave
