// The numbers of a load test, from its request records.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "services/loadgen/load_runner.h"

namespace cleave::loadgen {

// A latency SLO; 0 means no bound. A request meets it when it succeeded, its time to
// first token is <= ttft_ms, and its time per output token after the first
// ((done - first token) / (tokens - 1)) is <= itl_ms.
struct Slo {
  double ttft_ms = 0;
  double itl_ms = 0;
};

// Percentiles interpolate linearly between closest ranks (numpy's default); all 0 when
// there are no values.
struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
Distribution distributionOf(std::vector<double> values);

struct Summary {
  int64_t requests = 0;  // Measured (warm-up excluded).
  int64_t failed = 0;
  std::string first_error;
  // From the first measured request's send to the last one's end.
  double duration_s = 0;
  int64_t prompt_tokens = 0;         // Of succeeded requests.
  int64_t cached_prompt_tokens = 0;  // Of those, the ones the server's prefix cache held.
  int64_t output_tokens = 0;
  double request_rate = 0;       // Succeeded requests per second.
  double output_token_rate = 0;  // Generated tokens per second.
  double total_token_rate = 0;   // Prompt + generated tokens per second.
  double goodput = 0;            // Requests meeting the SLO per second.
  double slo_attainment = 0;     // Their fraction of measured requests.
  double mean_in_flight = 0;     // Sum of request latencies / duration.
  Distribution ttft_ms, itl_ms, tpot_ms, e2e_ms, queue_ms;
};

// `queue_ms` is the time between a request being due and being sent (open loop with every
// client busy; 0 in a closed loop).
Summary summarize(std::span<const RequestRecord> records, const Slo& slo);

}  // namespace cleave::loadgen
