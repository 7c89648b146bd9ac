// Drives a workload against a server and records what each request saw.
//
// Closed loop (rate == 0): `concurrency` clients each send their next request as soon as
// the previous one finishes. Open loop (rate > 0): requests arrive as a Poisson process
// of `rate` per second whatever the server does; `concurrency` caps the requests in flight
// (an arrival finding every client busy waits, and its wait counts in its latency).
//
// The first `warmup` requests are sent but flagged and left out of the summary. The run
// ends after `requests` measured requests, or `duration_s` after the first measured one
// was sent, whichever comes first (0 disables a limit; at least one must be set).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "services/loadgen/workload.h"

namespace cleave::loadgen {

// What one request saw. Times are seconds since the run started.
struct RequestRecord {
  uint64_t index = 0;
  bool warmup = false;
  double arrival_s = 0;  // When it was due (open loop) or taken by a client (closed loop).
  double sent_s = 0;
  double first_token_s = -1;  // -1: no token arrived.
  double done_s = 0;
  uint32_t prompt_tokens = 0;
  uint32_t cached_prompt_tokens = 0;  // Of those, the ones the server's prefix cache held.
  uint32_t output_tokens = 0;
  std::vector<double> itl_s;  // Gap before each later token (a message of n tokens adds n).
  absl::Status status;
};

// What the server reports of a request's prompt: its tokens, and those whose KV its prefix
// cache held.
struct PromptUsage {
  uint32_t tokens = 0;
  uint32_t cached = 0;
};

// Sends one request; calls on_tokens(n) as each group of n generated tokens arrives, and
// sets `prompt` when the server reports it. Returns the call's status. Called from several
// threads at once.
using Sender = std::function<absl::Status(const PlannedRequest& request,
                                          const std::function<void(uint32_t)>& on_tokens,
                                          PromptUsage& prompt)>;

struct RunProgress {
  int64_t done = 0;  // Measured requests finished (failed included).
  int64_t failed = 0;
  int64_t in_flight = 0;
  int64_t output_tokens = 0;
  double elapsed_s = 0;
};

struct RunOptions {
  int64_t concurrency = 1;
  double rate = 0;  // Requests per second; 0 = closed loop.
  int64_t warmup = 0;
  int64_t requests = 0;
  double duration_s = 0;
  uint64_t seed = 1;  // Arrival times.
  // Called about every progress_interval from a separate thread, and once at the end.
  std::function<void(const RunProgress&)> on_progress;
  std::chrono::milliseconds progress_interval{200};
};

// Records of every request sent (warm-up included), in the order they finished.
std::vector<RequestRecord> runLoad(const Workload& workload, const Sender& send,
                                   const RunOptions& options);

}  // namespace cleave::loadgen
