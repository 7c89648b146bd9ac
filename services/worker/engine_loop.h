// The worker's engine thread. It owns the Scheduler over the model's TpGroup and runs a
// step whenever there is work; every other thread reaches the scheduler through call(),
// which runs a function on the engine thread between two steps and returns its result.
// After each step the loop hands what the step produced to the sink, on the engine thread.
//
// Threading: call() from any thread (it blocks until the function has run); the sink runs
// on the engine thread and must not call(). The destructor stops the thread.
//
// Contract: a call returns after the sink has seen the pool it left (a report with stepped =
// false), so what the worker publishes (its gauges, its heartbeat) is never older than the
// call that changed it.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "services/engine/scheduler.h"

namespace cleave::worker {

// After each step, and after each round of calls (stepped = false, no events: the pool's
// numbers changed; the batch is the last step's, or empty when the engine is idle).
struct StepReport {
  bool stepped = true;
  uint64_t step_index = 0;
  int64_t batch_size = 0;    // Sequences in the step's batch.
  int64_t decode_batch = 0;  // Of those, the ones decoding.
  engine::Scheduler::StepWork work;
  int64_t step_time_us = 0;
  // The KV pool after the step.
  int64_t total_blocks = 0;
  int64_t free_blocks = 0;
  int64_t cached_blocks = 0;  // Of the free ones, those holding a reusable prefix.
  int64_t reserved_blocks = 0;
  // Since the loop started: prompt tokens looked up in the prefix cache, and found.
  int64_t prefix_lookup_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  // Sequences running, and requests waiting to (Scheduler::runningSequences, waitingRequests).
  int64_t running_sequences = 0;
  int64_t waiting_requests = 0;
  int64_t state_checkpoints = 0;  // Scheduler::stateCheckpoints.
  std::vector<engine::TokenEvent> events;
};

class EngineLoop {
 public:
  using Sink = std::function<void(StepReport&)>;
  EngineLoop(engine::TpGroup& model, const tokenizer::Tokenizer* tokenizer,
             const engine::SchedulerOptions& options, Sink sink);
  ~EngineLoop();

  // Runs fn(scheduler) on the engine thread and returns its result once the sink has seen
  // the pool fn left.
  template <typename F>
  auto call(F&& fn) -> decltype(fn(std::declval<engine::Scheduler&>())) {
    using R = decltype(fn(std::declval<engine::Scheduler&>()));
    auto promise = std::make_shared<std::promise<R>>();
    std::future<R> result = promise->get_future();
    post([&fn, promise](engine::Scheduler& s) -> Deliver {
      try {
        if constexpr (std::is_void_v<R>) {
          fn(s);
          return [promise] { promise->set_value(); };
        } else {
          return [promise, value = std::make_shared<R>(fn(s))] {
            promise->set_value(std::move(*value));
          };
        }
      } catch (...) {  // The caller's, as the call's own result.
        return [promise, error = std::current_exception()] { promise->set_exception(error); };
      }
    });
    return result.get();
  }

  // Like call(), but waits at most `wait` for the result: nullopt when the engine is still in
  // a step by then. fn runs all the same, later, and its result is dropped, so fn owns what
  // it captures.
  template <typename F>
  auto callWithin(std::chrono::milliseconds wait, F fn)
      -> std::optional<decltype(fn(std::declval<engine::Scheduler&>()))> {
    using R = decltype(fn(std::declval<engine::Scheduler&>()));
    auto promise = std::make_shared<std::promise<R>>();
    std::future<R> result = promise->get_future();
    post([fn = std::move(fn), promise](engine::Scheduler& s) mutable -> Deliver {
      try {
        return [promise, value = std::make_shared<R>(fn(s))] {
          promise->set_value(std::move(*value));
        };
      } catch (...) {
        return [promise, error = std::current_exception()] { promise->set_exception(error); };
      }
    });
    if (result.wait_for(wait) != std::future_status::ready) return std::nullopt;
    return result.get();
  }

 private:
  // A call runs on the scheduler and returns what hands its result to the caller.
  using Deliver = std::function<void()>;
  using Call = std::function<Deliver(engine::Scheduler&)>;
  void post(Call fn);
  void run();
  // Fills the report's KV pool and prefix-cache fields.
  void describePool(StepReport& report) const;

  engine::Scheduler scheduler_;
  Sink sink_;
  absl::Mutex mu_;
  std::vector<Call> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace cleave::worker
