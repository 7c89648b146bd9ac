#include "services/worker/worker_metrics.h"

#include "common/metrics.h"
#include "prometheus/family.h"

namespace cleave::worker {
namespace {

prometheus::Histogram& histogram(const std::string& name, const std::string& help,
                                 prometheus::Histogram::BucketBoundaries buckets) {
  return prometheus::BuildHistogram()
      .Name(name)
      .Help(help)
      .Register(metricsRegistry())
      .Add({}, std::move(buckets));
}

}  // namespace

WorkerMetrics::WorkerMetrics(int64_t target_concurrency)
    : batch_size_(
          plainGauge("cleave_worker_batch_sequences",
                     "Sequences in the last engine step's batch (decoding and prefilling)")),
      decode_batch_(plainGauge("cleave_worker_decode_sequences",
                               "Sequences decoding in the last engine step (the decode batch)")),
      target_(plainGauge("cleave_worker_target_concurrency",
                         "Sequences this worker is sized to decode at once (0: prefill only)")),
      blocks_total_(plainGauge("cleave_worker_kv_blocks_capacity", "KV blocks in the pool")),
      blocks_free_(plainGauge("cleave_worker_kv_blocks_free", "KV blocks held by nothing")),
      blocks_cached_(plainGauge("cleave_worker_kv_blocks_cached",
                                "Free KV blocks still holding a reusable prefix")),
      blocks_reserved_(plainGauge("cleave_worker_kv_blocks_reserved",
                                  "KV blocks held by reservations (reserved or decoding)")),
      state_checkpoints_(plainGauge("cleave_worker_state_checkpoints",
                                    "Linear-attention state checkpoints held for prefix caching "
                                    "(of --state-checkpoints)")),
      prefix_lookup_tokens_(plainCounter("cleave_worker_prefix_cache_lookup_tokens_total",
                                         "Prompt tokens looked up in the prefix cache")),
      prefix_hit_tokens_(plainCounter("cleave_worker_prefix_cache_hit_tokens_total",
                                      "Prompt tokens whose KV the prefix cache supplied")),
      steps_(plainCounter("cleave_worker_steps_total", "Engine steps run")),
      tokens_(plainCounter("cleave_worker_generated_tokens_total", "Tokens sampled")),
      prefill_tokens_(plainCounter("cleave_worker_prefill_tokens_total",
                                   "Prompt tokens computed (prefix-cache hits excluded)")),
      drafted_tokens_(plainCounter(
          "cleave_worker_speculative_draft_tokens_total",
          "Tokens drafted by prompt lookup and verified (speculative decoding; in steps' tokens)")),
      accepted_tokens_(plainCounter("cleave_worker_speculative_accepted_tokens_total",
                                    "Drafted tokens the model's own choice confirmed")),
      step_seconds_(histogram("cleave_worker_step_seconds",
                              "Wall time of one engine step (forward and sampling)",
                              {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2})),
      step_seconds_total_(
          plainCounter("cleave_worker_step_seconds_total", "Wall time of all engine steps")),
      floor_seconds_total_(plainCounter(
          "cleave_worker_step_floor_seconds_total",
          "The roofline floor of all engine steps (rate over step_seconds: efficiency)")),
      efficiency_(plainGauge("cleave_worker_step_efficiency",
                             "Floor over measured time of the last engine step")),
      kv_sent_bytes_(plainCounter("cleave_worker_kv_sent_bytes_total",
                                  "Prompt KV bytes written into decode workers")),
      kv_send_seconds_(histogram(
          "cleave_worker_kv_send_seconds", "Time to write one prompt's KV into its decode worker",
          {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5})),
      kv_send_failures_(plainCounter("cleave_worker_kv_send_failures_total",
                                     "Prompt KV writes into a decode worker that failed")),
      kv_cached_blocks_(plainCounter(
          "cleave_worker_kv_reserve_cached_blocks_total",
          "Prompt KV blocks a Reserve found in this worker's prefix cache (not sent to it)")),
      expired_(plainCounter("cleave_worker_requests_expired_total",
                            "Requests freed or fenced by the worker itself (ttl, deadline, "
                            "router gone)")),
      fenced_blocks_(plainGauge("cleave_worker_kv_blocks_fenced",
                                "KV blocks only fenced reservations hold, kept out of use for "
                                "--kv-quarantine-ms (a KV write into them may still come)")),
      fences_(plainCounter("cleave_worker_kv_fences_total",
                           "Reservations fenced instead of freed (a writer may still write)")) {
  target_.Set(static_cast<double>(target_concurrency));
}

void WorkerMetrics::onStep(const StepReport& report, std::optional<double> floor_seconds) {
  batch_size_.Set(static_cast<double>(report.batch_size));
  decode_batch_.Set(static_cast<double>(report.decode_batch));
  blocks_total_.Set(static_cast<double>(report.total_blocks));
  blocks_free_.Set(static_cast<double>(report.free_blocks));
  blocks_cached_.Set(static_cast<double>(report.cached_blocks));
  blocks_reserved_.Set(static_cast<double>(report.reserved_blocks));
  state_checkpoints_.Set(static_cast<double>(report.state_checkpoints));
  prefix_lookup_tokens_.Increment(
      static_cast<double>(report.prefix_lookup_tokens - last_lookup_tokens_));
  prefix_hit_tokens_.Increment(static_cast<double>(report.prefix_hit_tokens - last_hit_tokens_));
  last_lookup_tokens_ = report.prefix_lookup_tokens;
  last_hit_tokens_ = report.prefix_hit_tokens;
  if (!report.stepped) return;
  const double seconds = static_cast<double>(report.step_time_us) * 1e-6;
  steps_.Increment();
  tokens_.Increment(static_cast<double>(report.events.size()));
  // Every decoding sequence computes one token; the rest of the step's tokens are prompt.
  prefill_tokens_.Increment(
      static_cast<double>(report.work.tokens - report.decode_batch - report.work.drafted));
  drafted_tokens_.Increment(static_cast<double>(report.work.drafted));
  accepted_tokens_.Increment(static_cast<double>(report.work.accepted));
  step_seconds_.Observe(seconds);
  if (floor_seconds && seconds > 0) {
    step_seconds_total_.Increment(seconds);
    floor_seconds_total_.Increment(*floor_seconds);
    efficiency_.Set(*floor_seconds / seconds);
  }
}

void WorkerMetrics::onReserveCached(int64_t blocks) {
  kv_cached_blocks_.Increment(static_cast<double>(blocks));
}

void WorkerMetrics::onKvSent(uint64_t bytes, double seconds, bool ok) {
  if (!ok) {
    kv_send_failures_.Increment();
    return;
  }
  kv_sent_bytes_.Increment(static_cast<double>(bytes));
  kv_send_seconds_.Observe(seconds);
}

void WorkerMetrics::onRequestExpired() { expired_.Increment(); }

void WorkerMetrics::onFenced() { fences_.Increment(); }

void WorkerMetrics::setFencedBlocks(int64_t blocks) {
  fenced_blocks_.Set(static_cast<double>(blocks));
}

prometheus::Gauge& WorkerMetrics::stagingFree(const std::string& direction, int64_t capacity) {
  prometheus::BuildGauge()
      .Name("cleave_worker_kv_staging_blocks_capacity")
      .Help("Host staging rows KV transfers pass through, in blocks, per direction")
      .Register(metricsRegistry())
      .Add({{"direction", direction}})
      .Set(static_cast<double>(capacity));
  return prometheus::BuildGauge()
      .Name("cleave_worker_kv_staging_blocks_free")
      .Help("Host staging rows no transfer holds, in blocks, per direction")
      .Register(metricsRegistry())
      .Add({{"direction", direction}});
}

void WorkerMetrics::exportMemoryPlan(const engine::MemoryPlan& plan) {
  auto& family = prometheus::BuildGauge()
                     .Name("cleave_worker_memory_plan_bytes")
                     .Help("The memory plan: budget = weights + workspace + kv_pool (per rank)")
                     .Register(metricsRegistry());
  family.Add({{"term", "budget"}}).Set(static_cast<double>(plan.budget));
  family.Add({{"term", "weights"}}).Set(static_cast<double>(plan.weights));
  family.Add({{"term", "workspace"}}).Set(static_cast<double>(plan.workspace));
  family.Add({{"term", "kv_pool"}}).Set(static_cast<double>(plan.kv_pool));
}

void WorkerMetrics::exportInfo(const std::string& worker_id, const std::string& role,
                               const std::string& model, int64_t tp) {
  prometheus::BuildGauge()
      .Name("cleave_worker_info")
      .Help("This worker's id, role, model and tensor-parallel degree (value 1)")
      .Register(metricsRegistry())
      .Add({{"worker_id", worker_id}, {"role", role}, {"model", model}, {"tp", std::to_string(tp)}})
      .Set(1);
}

void WorkerMetrics::exportHardware(const roofline::Hardware& hardware) {
  plainGauge("cleave_worker_roofline_bandwidth_bytes_per_second",
             "Memory read bandwidth the step floors are computed against (measured at start)")
      .Set(hardware.bandwidth);
  auto& flops = prometheus::BuildGauge()
                    .Name("cleave_worker_roofline_flops_per_second")
                    .Help(
                        "Arithmetic peaks the step floors are computed against (measured at "
                        "start): the weights' products and attention")
                    .Register(metricsRegistry());
  flops.Add({{"operation", "weights"}}).Set(hardware.peak_flops);
  flops.Add({{"operation", "attention"}}).Set(hardware.attention_flops);
}

}  // namespace cleave::worker
