#include "services/loadgen/load_runner.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace cleave::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

// Shared state of one run.
class Run {
 public:
  Run(const Workload& workload, const Sender& send, const RunOptions& options)
      : workload_(workload), send_(send), options_(options), start_(Clock::now()) {}

  double now() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  Clock::time_point start() const { return start_; }

  // The next request index, or false when the run is over.
  bool take(uint64_t& index) {
    absl::MutexLock lock(&mu_);
    if (over_ || (options_.requests > 0 &&
                  next_ >= static_cast<uint64_t>(options_.warmup + options_.requests))) {
      over_ = true;
      return false;
    }
    if (options_.duration_s > 0 && measure_start_ >= 0 &&
        now() - measure_start_ >= options_.duration_s) {
      over_ = true;
      return false;
    }
    index = next_++;
    return true;
  }

  void execute(uint64_t index, double arrival_s) {
    RequestRecord record;
    record.index = index;
    record.warmup = static_cast<int64_t>(index) < options_.warmup;
    record.arrival_s = arrival_s;
    const PlannedRequest request = workload_.at(index);
    record.prompt_tokens = static_cast<uint32_t>(request.prompt_ids.size());
    record.sent_s = now();
    {
      absl::MutexLock lock(&mu_);
      if (!record.warmup && measure_start_ < 0) measure_start_ = record.sent_s;
      ++in_flight_;
    }
    double last = record.sent_s;
    auto on_tokens = [&](uint32_t n) {
      const double t = now();
      if (n == 0) return;
      if (record.first_token_s < 0) {
        record.first_token_s = t;
      } else {
        record.itl_s.insert(record.itl_s.end(), n, (t - last) / n);
      }
      last = t;
      record.output_tokens += n;
      if (!record.warmup) output_tokens_ += n;
    };
    PromptUsage prompt{.tokens = record.prompt_tokens};
    record.status = send_(request, on_tokens, prompt);
    record.prompt_tokens = prompt.tokens;
    record.cached_prompt_tokens = prompt.cached;
    record.done_s = now();
    absl::MutexLock lock(&mu_);
    --in_flight_;
    if (!record.warmup) {
      ++done_;
      if (!record.status.ok()) ++failed_;
    }
    records_.push_back(std::move(record));
  }

  RunProgress progress() {
    absl::MutexLock lock(&mu_);
    return {done_, failed_, in_flight_, output_tokens_.load(), now()};
  }

  std::vector<RequestRecord> takeRecords() {
    absl::MutexLock lock(&mu_);
    return std::move(records_);
  }

 private:
  const Workload& workload_;
  const Sender& send_;
  const RunOptions& options_;
  const Clock::time_point start_;
  std::atomic<int64_t> output_tokens_{0};
  absl::Mutex mu_;
  bool over_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  double measure_start_ ABSL_GUARDED_BY(mu_) = -1;  // When the first measured request went.
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<RequestRecord> records_ ABSL_GUARDED_BY(mu_);
};

// Open loop: the caller's thread releases requests at Poisson arrival times into a queue
// that `concurrency` clients drain.
void runOpenLoop(Run& run, const RunOptions& options) {
  std::mutex mu;
  std::condition_variable ready;
  std::deque<std::pair<uint64_t, double>> due;  // (index, arrival), guarded by mu.
  bool closed = false;                          // Guarded by mu.
  std::vector<std::thread> clients;
  for (int64_t c = 0; c < options.concurrency; ++c) {
    clients.emplace_back([&] {
      for (;;) {
        std::pair<uint64_t, double> next;
        {
          std::unique_lock<std::mutex> lock(mu);
          ready.wait(lock, [&] { return closed || !due.empty(); });
          if (due.empty()) return;
          next = due.front();
          due.pop_front();
        }
        run.execute(next.first, next.second);
      }
    });
  }
  std::mt19937_64 rng(options.seed);
  std::exponential_distribution<double> gap(options.rate);
  double arrival = 0;
  for (uint64_t index = 0;;) {
    arrival += gap(rng);
    std::this_thread::sleep_until(run.start() + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(arrival)));
    if (!run.take(index)) break;
    std::lock_guard<std::mutex> lock(mu);
    due.emplace_back(index, arrival);
    ready.notify_one();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    closed = true;
  }
  ready.notify_all();
  for (std::thread& t : clients) t.join();
}

void runClosedLoop(Run& run, const RunOptions& options) {
  std::vector<std::thread> clients;
  for (int64_t c = 0; c < options.concurrency; ++c) {
    clients.emplace_back([&] {
      for (uint64_t index = 0; run.take(index);) run.execute(index, run.now());
    });
  }
  for (std::thread& t : clients) t.join();
}

}  // namespace

std::vector<RequestRecord> runLoad(const Workload& workload, const Sender& send,
                                   const RunOptions& options) {
  Run run(workload, send, options);
  std::mutex mu;
  std::condition_variable stop;
  bool finished = false;  // Guarded by mu.
  std::thread reporter;
  if (options.on_progress) {
    reporter = std::thread([&] {
      std::unique_lock<std::mutex> lock(mu);
      while (!stop.wait_for(lock, options.progress_interval, [&] { return finished; })) {
        options.on_progress(run.progress());
      }
    });
  }
  if (options.rate > 0) {
    runOpenLoop(run, options);
  } else {
    runClosedLoop(run, options);
  }
  if (reporter.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu);
      finished = true;
    }
    stop.notify_all();
    reporter.join();
    options.on_progress(run.progress());
  }
  return run.takeRecords();
}

}  // namespace cleave::loadgen
