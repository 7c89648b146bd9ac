// A worker's Prometheus metrics (cleave_worker_*; docs/metrics.md): the engine's steps and
// their roofline floors, the decode batch against the target, the KV pool and prefix
// cache, KV sent to decode workers, expired requests, and the memory plan.
//
// Threading: onStep() from the engine thread; the other methods from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "services/engine/memory_plan.h"
#include "services/roofline/roofline.h"
#include "services/worker/engine_loop.h"

namespace cleave::worker {

class WorkerMetrics {
 public:
  explicit WorkerMetrics(int64_t target_concurrency);

  // `floor_seconds`: the step's roofline floor, when the hardware is known.
  void onStep(const StepReport& report, std::optional<double> floor_seconds);
  void onKvSent(uint64_t bytes, double seconds, bool ok);
  // A Reserve found `blocks` of its prompt in this worker's cache (not to be sent).
  void onReserveCached(int64_t blocks);
  void onRequestExpired();
  // One more reservation was fenced.
  void onFenced();
  // The blocks fenced reservations hold that no other reservation holds.
  void setFencedBlocks(int64_t blocks);
  // The staging rows of one direction ("send" or "receive"; kv_staging.h): how many there
  // are, and a gauge of how many are free (any thread).
  static prometheus::Gauge& stagingFree(const std::string& direction, int64_t capacity);
  static void exportMemoryPlan(const engine::MemoryPlan& plan);
  // cleave_worker_info{worker_id, role, model, tp} = 1, to label a worker's other series
  // by joining.
  static void exportInfo(const std::string& worker_id, const std::string& role,
                         const std::string& model, int64_t tp);
  // What every step's floor is computed against (measured at start).
  static void exportHardware(const roofline::Hardware& hardware);

 private:
  prometheus::Gauge& batch_size_;
  prometheus::Gauge& decode_batch_;
  prometheus::Gauge& target_;
  prometheus::Gauge& blocks_total_;
  prometheus::Gauge& blocks_free_;
  prometheus::Gauge& blocks_cached_;
  prometheus::Gauge& blocks_reserved_;
  prometheus::Gauge& state_checkpoints_;
  prometheus::Counter& prefix_lookup_tokens_;
  prometheus::Counter& prefix_hit_tokens_;
  prometheus::Counter& steps_;
  prometheus::Counter& tokens_;
  prometheus::Counter& prefill_tokens_;
  prometheus::Counter& drafted_tokens_;
  prometheus::Counter& accepted_tokens_;
  prometheus::Histogram& step_seconds_;
  prometheus::Counter& step_seconds_total_;
  prometheus::Counter& floor_seconds_total_;
  prometheus::Gauge& efficiency_;
  prometheus::Counter& kv_sent_bytes_;
  prometheus::Histogram& kv_send_seconds_;
  prometheus::Counter& kv_send_failures_;
  prometheus::Counter& kv_cached_blocks_;
  prometheus::Counter& expired_;
  prometheus::Gauge& fenced_blocks_;
  prometheus::Counter& fences_;
  // The report's cumulative prefix-cache counts at the last step (engine thread).
  int64_t last_lookup_tokens_ = 0;
  int64_t last_hit_tokens_ = 0;
};

}  // namespace cleave::worker
