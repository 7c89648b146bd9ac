// A load test's results as JSON (one file per run: its settings and one summary per sweep
// point) and as a self-contained HTML page with SVG charts comparing runs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/loadgen/summary.h"

namespace cleave::loadgen {

struct SweepPoint {
  int64_t concurrency = 0;  // Clients (closed loop) or the in-flight cap (open loop).
  double rate = 0;          // Poisson arrivals per second; 0 for a closed loop.
  Summary summary;
};

struct BenchRun {
  std::string label;    // What the run measured ("both", "disaggregated").
  std::string command;  // The command line that produced it.
  std::string router;
  std::string prompt_len, output_len;  // As given ("128", "64:256", "file:PATH").
  Slo slo;
  std::vector<SweepPoint> points;
};

// What the sweep varied at `point`: "c=16" or "2.5 req/s".
std::string loadOf(const SweepPoint& point);

std::string runToJson(const BenchRun& run);
// `source` names the file in errors.
absl::StatusOr<BenchRun> runFromJson(absl::string_view text, absl::string_view source);

// One page: a table per run and charts of throughput against load and of TTFT, inter-token
// latency and end-to-end latency (p50 solid, p99 dashed) against throughput, runs overlaid.
std::string htmlReport(std::span<const BenchRun> runs, const std::string& title);

}  // namespace cleave::loadgen
