#include "services/worker/engine_loop.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "common/faults.h"
#include "common/log.h"

namespace cleave::worker {

EngineLoop::EngineLoop(engine::TpGroup& model, const tokenizer::Tokenizer* tokenizer,
                       const engine::SchedulerOptions& options, Sink sink)
    : scheduler_(model, tokenizer, options), sink_(std::move(sink)) {
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void EngineLoop::post(Call fn) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
}

void EngineLoop::run() {
  uint64_t step_index = 0;
  // Steps that failed in a row. A step fails when the model does (a GPU error, a broken
  // invariant); the same batch would fail again, so after a few the process ends, as a
  // crash would, and the router moves its sequences to other workers.
  constexpr int kFailuresToExit = 3;
  int failures = 0;
  while (true) {
    std::vector<Call> calls;
    const bool busy = !scheduler_.idle();  // Read here: only this thread touches scheduler_.
    {
      absl::MutexLock lock(&mu_);
      // Idle: sleep until a call arrives. Busy: take what has arrived and step.
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty() || busy;
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      calls.swap(queue_);
    }
    std::vector<Deliver> results;
    results.reserve(calls.size());
    for (Call& call : calls) results.push_back(call(scheduler_));
    const bool idle = scheduler_.idle();
    // Stepping before these calls and after them: the last step's batch still runs (one
    // the calls started has not stepped yet).
    const bool running = busy && !idle;
    if (!calls.empty()) {
      // Busy: the batch the last step ran is the batch still running.
      StepReport pool{.stepped = false,
                      .batch_size = running ? scheduler_.lastBatchSequences() : 0,
                      .decode_batch = running ? scheduler_.lastDecodeSequences() : 0};
      describePool(pool);
      sink_(pool);
    }
    for (Deliver& deliver : results) deliver();
    if (idle) continue;
    StepReport report{.step_index = step_index++};
    const auto start = std::chrono::steady_clock::now();
    // engine_step_delay=N,engine_step_delay_ms=T: the next N steps each take T longer.
    if (faults::fire("engine_step_delay")) faults::delay("engine_step_delay_ms");
    absl::StatusOr<std::vector<engine::TokenEvent>> events = scheduler_.step();
    report.step_time_us = std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::steady_clock::now() - start)
                              .count();
    if (events.ok() && faults::fire("engine_step_fail"))
      events = absl::InternalError("injected fault engine_step_fail");
    if (!events.ok()) {
      // Requests are checked when they join, so a failing step is a broken invariant.
      CLEAVE_LOG(ERROR) << "engine step failed: " << events.status();
      // A stateful model's first failure already leaves its sequences' state unknown.
      if (++failures >= (scheduler_.stepsRetryable() ? kFailuresToExit : 1)) {
        CLEAVE_LOG(ERROR) << "engine steps failed " << failures
                          << " times in a row: exiting so that the router moves this worker's "
                             "sequences";
        std::fflush(stderr);
        std::_Exit(1);
      }
      continue;
    }
    failures = 0;
    report.events = std::move(*events);
    report.batch_size = scheduler_.lastBatchSequences();
    report.decode_batch = scheduler_.lastDecodeSequences();
    report.work = scheduler_.lastStepWork();
    describePool(report);
    sink_(report);
  }
}

void EngineLoop::describePool(StepReport& report) const {
  report.total_blocks = scheduler_.cache().totalBlocks();
  report.free_blocks = scheduler_.freeBlocks();
  report.cached_blocks = scheduler_.cache().cachedBlocks();
  report.reserved_blocks = scheduler_.reservedBlocks();
  report.prefix_lookup_tokens = scheduler_.prefixLookupTokens();
  report.prefix_hit_tokens = scheduler_.prefixHitTokens();
  report.running_sequences = scheduler_.runningSequences();
  report.waiting_requests = scheduler_.waitingRequests();
  report.state_checkpoints = scheduler_.stateCheckpoints();
}

}  // namespace cleave::worker
