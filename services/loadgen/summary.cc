#include "services/loadgen/summary.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace cleave::loadgen {
namespace {

double rank(const std::vector<double>& sorted, double p) {
  const double position = p * static_cast<double>(sorted.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  return sorted[below] + (sorted[above] - sorted[below]) * (position - static_cast<double>(below));
}

}  // namespace

Distribution distributionOf(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = static_cast<int64_t>(values.size());
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  d.p50 = rank(values, 0.5);
  d.p90 = rank(values, 0.9);
  d.p99 = rank(values, 0.99);
  d.max = values.back();
  return d;
}

Summary summarize(std::span<const RequestRecord> records, const Slo& slo) {
  Summary s;
  std::vector<double> ttft, itl, tpot, e2e, queue;
  double first_sent = std::numeric_limits<double>::infinity(), last_done = 0, busy = 0;
  int64_t good = 0;
  for (const RequestRecord& r : records) {
    if (r.warmup) continue;
    ++s.requests;
    first_sent = std::min(first_sent, r.sent_s);
    last_done = std::max(last_done, r.done_s);
    busy += r.done_s - r.sent_s;
    if (!r.status.ok()) {
      if (s.failed++ == 0) s.first_error = r.status.ToString();
      continue;
    }
    s.prompt_tokens += r.prompt_tokens;
    s.cached_prompt_tokens += r.cached_prompt_tokens;
    s.output_tokens += r.output_tokens;
    e2e.push_back(1e3 * (r.done_s - r.sent_s));
    queue.push_back(1e3 * (r.sent_s - r.arrival_s));
    for (double gap : r.itl_s) itl.push_back(1e3 * gap);
    bool meets = true;
    if (r.first_token_s >= 0) {
      const double first_ms = 1e3 * (r.first_token_s - r.sent_s);
      ttft.push_back(first_ms);
      meets = slo.ttft_ms <= 0 || first_ms <= slo.ttft_ms;
    }
    if (r.output_tokens > 1) {
      const double per_token_ms = 1e3 * (r.done_s - r.first_token_s) / (r.output_tokens - 1);
      tpot.push_back(per_token_ms);
      meets = meets && (slo.itl_ms <= 0 || per_token_ms <= slo.itl_ms);
    }
    good += meets ? 1 : 0;
  }
  if (s.requests == 0) return s;
  s.duration_s = std::max(last_done - first_sent, 1e-9);
  const int64_t succeeded = s.requests - s.failed;
  s.request_rate = static_cast<double>(succeeded) / s.duration_s;
  s.output_token_rate = static_cast<double>(s.output_tokens) / s.duration_s;
  s.total_token_rate = static_cast<double>(s.prompt_tokens + s.output_tokens) / s.duration_s;
  s.goodput = static_cast<double>(good) / s.duration_s;
  s.slo_attainment = static_cast<double>(good) / static_cast<double>(s.requests);
  s.mean_in_flight = busy / s.duration_s;
  s.ttft_ms = distributionOf(std::move(ttft));
  s.itl_ms = distributionOf(std::move(itl));
  s.tpot_ms = distributionOf(std::move(tpot));
  s.e2e_ms = distributionOf(std::move(e2e));
  s.queue_ms = distributionOf(std::move(queue));
  return s;
}

}  // namespace cleave::loadgen
