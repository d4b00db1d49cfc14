// A small fork-join thread pool for the CPU backend: parallel_for(n, fn) runs fn(i) for
// i in [0, n) on the pool's workers and the calling thread, and rethrows the first exception.
// Work is handed out one index at a time, so which thread runs an index varies; callers keep
// results deterministic by making each index's work independent (one stream per index).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace kvdrive {

class ThreadPool {
 public:
  /// threads: total threads including the caller; 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(unsigned threads = 0) {
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    workers_.reserve(threads - 1);
    for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  unsigned threads() const { return static_cast<unsigned>(workers_.size()) + 1; }

  /// Runs fn(i) for every i in [0, n); returns when all are done. Not reentrant.
  void parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn) {
    if (n == 0) return;
    if (workers_.empty() || n == 1) {
      for (std::size_t i = 0; i < n; ++i) fn(i);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      job_ = &fn;
      job_size_ = n;
      next_.store(0);
      error_ = nullptr;
      active_ = workers_.size();
      ++generation_;
    }
    wake_.notify_all();
    run_indices();
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return active_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void run_indices() {
    for (;;) {
      const std::size_t i = next_.fetch_add(1);
      if (i >= job_size_) return;
      try {
        (*job_)(i);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
        next_.store(job_size_);  // stop handing out work
      }
    }
  }

  void worker_loop() {
    std::size_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      run_indices();
      std::lock_guard lock(mutex_);
      if (--active_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(std::size_t)>* job_ = nullptr;
  std::size_t job_size_ = 0;
  std::atomic<std::size_t> next_{0};
  std::exception_ptr error_;
  std::size_t active_ = 0;
  std::size_t generation_ = 0;
  bool stopping_ = false;
};

}  // namespace kvdrive
