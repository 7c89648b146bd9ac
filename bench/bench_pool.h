// The thread pool the CPU kernel benchmarks run on: CLEAVE_THREADS threads (default: every
// core), made once.
#pragma once

#include <cstdlib>
#include <thread>

#include "kernels/cpu/thread_pool.h"

namespace cleave::bench {

inline int threads() {
  const char* env = std::getenv("CLEAVE_THREADS");
  return env ? std::atoi(env) : static_cast<int>(std::thread::hardware_concurrency());
}

inline cpu::ThreadPool& pool() {
  static cpu::ThreadPool* p = new cpu::ThreadPool(threads());
  return *p;
}

}  // namespace cleave::bench
