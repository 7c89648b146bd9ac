// A fixed set of worker threads for data-parallel kernels.
//
// run(n, fn) calls fn(task) for task in [0, n) spread over the pool's threads and the
// calling thread, and returns when all tasks are done. Workers spin briefly between jobs
// (a decode step issues hundreds of small jobs; waking sleeping threads for each would
// cost more than the work) and then sleep. A worker joins a job only while it is open; the
// caller closes it once every task is claimed and waits only for workers that joined, so
// a worker the OS has not scheduled never holds a job up (the caller does its share).
//
// Threading contract: one thread at a time calls run() (the rank thread that owns the
// pool); fn must not call run() on the same pool. Construction starts the workers,
// destruction stops and joins them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cleave::cpu {

class ThreadPool {
 public:
  // `threads` counts the calling thread: 1 means no workers.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(0..tasks-1); tasks are claimed dynamically, so uneven tasks balance.
  void run(int64_t tasks, const std::function<void(int64_t task)>& fn);

  // Splits [0, n) into about size() chunks of `align` multiples and runs
  // fn(begin, end) on each.
  void parallelFor(int64_t n, int64_t align, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void workerLoop(int index);
  void drain();

  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> next_task_{0};
  // Workers inside the current job, plus kClosed once the caller has closed it.
  std::atomic<int64_t> job_state_{0};
  std::atomic<int64_t> tasks_{0};
  std::atomic<const std::function<void(int64_t)>*> fn_{nullptr};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
};

}  // namespace cleave::cpu
