// parallel.hpp: run N independent tasks on a few threads (no pool kept between calls).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "fault_guard.hpp"

namespace numalign::detail {

inline int resolve_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

// Calls task(i) for i in [0, n) on up to `threads` threads; `tick` runs on the calling
// thread every few milliseconds while work is in flight (for progress bars). Each task runs
// guarded (fault_guard.hpp): a mapped file that shrinks under it is an Error, not a SIGBUS.
// The first exception a task throws stops the others taking new tasks and is rethrown here.
inline void parallel_for(std::size_t n, int threads, const std::function<void(std::size_t)>& task,
                         const std::function<void()>& tick = {}) {
  const std::size_t workers = std::min<std::size_t>(static_cast<std::size_t>(threads), n);
  if (workers <= 1) {
    for (std::size_t i = 0; i < n; ++i) {
      guarded([&] { task(i); });
      if (tick) tick();
    }
    return;
  }
  std::atomic<std::size_t> next{0};
  std::size_t running = workers;
  std::mutex mutex;
  std::condition_variable finished;
  std::exception_ptr error;
  std::vector<std::thread> pool;
  pool.reserve(workers);
  for (std::size_t w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      try {
        for (std::size_t i = next++; i < n; i = next++) guarded([&] { task(i); });
      } catch (...) {
        next = n;  // the others stop after their current task
        const std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
      const std::lock_guard<std::mutex> lock(mutex);
      if (--running == 0) finished.notify_one();
    });
  }
  if (tick) {
    // Ticks every 50 ms, but returns as soon as the work is done (no sleep to finish).
    std::unique_lock<std::mutex> lock(mutex);
    while (!finished.wait_for(lock, std::chrono::milliseconds(50), [&] { return running == 0; })) {
      lock.unlock();
      tick();
      lock.lock();
    }
  }
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  if (tick) tick();
}

}  // namespace numalign::detail
