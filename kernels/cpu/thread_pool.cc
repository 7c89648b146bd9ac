#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>

namespace cleave::cpu {
namespace {
constexpr int kSpinIterations = 20000;
constexpr int64_t kClosed = int64_t{1} << 40;
}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) {
    workers_.emplace_back([this, i] { workerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(sleep_mutex_);
    stopping_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::drain() {
  const int64_t tasks = tasks_.load(std::memory_order_acquire);
  const auto* fn = fn_.load(std::memory_order_acquire);
  while (true) {
    int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= tasks) return;
    (*fn)(task);
  }
}

void ThreadPool::workerLoop(int) {
  uint64_t seen = 0;
  while (true) {
    uint64_t current = generation_.load(std::memory_order_acquire);
    for (int spin = 0; current == seen && spin < kSpinIterations; ++spin) {
      _mm_pause();
      current = generation_.load(std::memory_order_acquire);
    }
    if (current == seen) {
      std::unique_lock lock(sleep_mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      current = generation_.load(std::memory_order_acquire);
    }
    seen = current;
    if (stopping_.load()) return;
    // Join the open job, if any; a closed one is already fully claimed.
    int64_t state = job_state_.load(std::memory_order_acquire);
    while (state < kClosed &&
           !job_state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel)) {
    }
    if (state >= kClosed) continue;
    drain();
    job_state_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(int64_t tasks, const std::function<void(int64_t)>& fn) {
  if (tasks <= 0) return;
  if (workers_.empty() || tasks == 1) {
    for (int64_t t = 0; t < tasks; ++t) fn(t);
    return;
  }
  // No worker is inside a job here (the previous run() waited for joined ones), so the
  // job's fields can be set before it opens.
  fn_.store(&fn, std::memory_order_relaxed);
  tasks_.store(tasks, std::memory_order_relaxed);
  next_task_.store(0, std::memory_order_relaxed);
  job_state_.store(0, std::memory_order_release);
  {
    // Publishing under the lock pairs with sleepers' predicate check.
    std::lock_guard lock(sleep_mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  drain();
  // Every task is claimed: close the job and wait for the workers that joined it.
  job_state_.fetch_add(kClosed, std::memory_order_acq_rel);
  while (job_state_.load(std::memory_order_acquire) != kClosed) _mm_pause();
}

void ThreadPool::parallelFor(int64_t n, int64_t align,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  int64_t units = (n + align - 1) / align;
  int64_t chunks = std::min<int64_t>(units, size());
  int64_t per_chunk = (units + chunks - 1) / chunks;
  run(chunks, [&](int64_t chunk) {
    int64_t begin = chunk * per_chunk * align;
    int64_t end = std::min(n, (chunk + 1) * per_chunk * align);
    if (begin < end) fn(begin, end);
  });
}

}  // namespace cleave::cpu
