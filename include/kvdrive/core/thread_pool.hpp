// A fork-join thread pool for the CPU backend and the decoder: parallel_for(n, fn) runs fn(i) for
// i in [0, n) on the pool's workers and the calling thread, and rethrows the first exception.
// Work is handed out one index at a time, so which thread runs an index varies; callers keep
// results deterministic by making each index's work independent (one stream per index).
//
// The workers persist and meet the caller at a spin-then-sleep barrier, as llama.cpp's threads
// meet at ggml_barrier: after a job a worker polls for the next one for up to `spin` (default
// kDefaultSpin, or KVD_POOL_SPIN_US microseconds from the environment), which is shorter than
// the gap between the products of a decode step, and only then sleeps on a condition variable;
// the caller waits for the last worker the same way. A decode step's dozens of fork-joins thus
// cost a few hundred nanoseconds each instead of a futex wake and a context switch, and a pool
// left idle (the program waiting on I/O, or done) sleeps after at most `spin`. spin = 0 sleeps at
// once (pools of I/O threads, which block in the kernel anyway). On oversubscribed cores polling
// loses (the poller holds the core the awaited thread needs), so a poll that lost its core to
// another program stops the polling for a while (polling::SpinGate): the pool then sleeps between
// jobs. bench/bench_thread_pool measures both ways.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <sys/resource.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvdrive {

/// The pool's polling: how a thread waits a little before it sleeps, and when it should not.
namespace polling {

/// One polite poll of a spin loop: the CPU's pause hint, where it has one.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::this_thread::yield();
#endif
}

/// Whether polling pays. It does while every pool thread has a core to itself; it does not once
/// the cores are oversubscribed (other programs, or more busy threads than cores), where a poller
/// takes the core that the thread it waits for needs, and every barrier waits for the scheduler.
/// The sign: a poll that yields its core and gets it back only after kSwitchedOut or more, having
/// been switched out for another thread (its involuntary context switches grew, getrusage
/// RUSAGE_THREAD), closes the gate for kClosedFor, in which the pool sleeps at once, as a pool
/// without polling does. On idle cores a yield finds nobody to switch to and returns at once, and
/// the kernel's own threads take the core for microseconds; another program takes it for a
/// scheduler slice (milliseconds).
class SpinGate {
 public:
  static constexpr std::chrono::milliseconds kClosedFor{200};
  static constexpr std::chrono::microseconds kSwitchedOut{200};

  bool open() const { return now_ns() >= closed_until_ns_.load(std::memory_order_relaxed); }
  void close() { closed_until_ns_.store(now_ns() + std::chrono::nanoseconds(kClosedFor).count(), std::memory_order_relaxed); }

  /// The calling thread's involuntary context switches so far (0 where the system does not say).
  static long thread_switches() {
#ifdef RUSAGE_THREAD
    rusage usage{};
    if (getrusage(RUSAGE_THREAD, &usage) == 0) return usage.ru_nivcsw;
#endif
    return 0;
  }

 private:
  static std::int64_t now_ns() { return std::chrono::steady_clock::now().time_since_epoch() / std::chrono::nanoseconds(1); }
  std::atomic<std::int64_t> closed_until_ns_{0};
};

/// Polls `done()` for up to `spin` while `gate` is open; true as soon as it holds, false when
/// the time is up. The first polls only pause the core; later ones yield it, so that a thread
/// that shares the core (the one being waited for, or other work) runs instead of the poll, and
/// a yield that lost the core closes the gate.
template <class Done>
bool spin_until(std::chrono::microseconds spin, SpinGate& gate, const Done& done) {
  if (spin.count() <= 0 || !gate.open()) return done();
  for (int i = 0; i < 256; ++i) {
    if (done()) return true;
    cpu_relax();
  }
  const long switches = SpinGate::thread_switches();
  auto round_start = std::chrono::steady_clock::now();
  const auto deadline = round_start + spin;
  auto longest_round = round_start - round_start;
  bool met = false;
  while (!met) {
    for (int i = 0; i < 16 && !met; ++i) {
      met = done();
      if (!met) std::this_thread::yield();
    }
    const auto now = std::chrono::steady_clock::now();
    longest_round = std::max(longest_round, now - round_start);
    if (now >= deadline) break;
    round_start = now;
  }
  if (longest_round > SpinGate::kSwitchedOut && SpinGate::thread_switches() != switches) gate.close();
  return met || done();
}

}  // namespace polling

class ThreadPool {
 public:
  /// How long a worker polls for the next job, and the caller for the last worker, before sleeping.
  static constexpr std::chrono::microseconds kDefaultSpin{200};

  /// kDefaultSpin, or KVD_POOL_SPIN_US from the environment (0: sleep at once).
  static std::chrono::microseconds default_spin() {
    const char* env = std::getenv("KVD_POOL_SPIN_US");
    if (env == nullptr || *env == '\0') return kDefaultSpin;
    return std::chrono::microseconds{std::max(0ll, std::atoll(env))};
  }

  /// threads: total threads including the caller; 0 means std::thread::hardware_concurrency().
  /// More threads than the machine has never spin: a poll would only take a core from a worker.
  explicit ThreadPool(unsigned threads = 0, std::chrono::microseconds spin = default_spin()) {
    const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
    if (threads == 0) threads = hardware;
    spin_ = threads > hardware ? std::chrono::microseconds{0} : spin;
    workers_.reserve(threads - 1);
    for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() {
    stopping_.store(true);
    publish();
    for (auto& w : workers_) w.join();
  }

  unsigned threads() const { return static_cast<unsigned>(workers_.size()) + 1; }
  std::chrono::microseconds spin() const { return spin_; }

  /// Runs fn(i) for every i in [0, n); returns when all are done. Not reentrant: one caller at a
  /// time, and fn must not call parallel_for on the same pool.
  void parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn) {
    if (n == 0) return;
    if (workers_.empty() || n == 1) {
      for (std::size_t i = 0; i < n; ++i) fn(i);
      return;
    }
    job_ = &fn;
    job_size_ = n;
    next_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    pending_.store(static_cast<unsigned>(workers_.size()), std::memory_order_relaxed);
    publish();
    run_indices();
    wait_for_workers();
    job_ = nullptr;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  /// Starts the next generation (a job, or the stop) and wakes the workers that sleep.
  void publish() {
    generation_.fetch_add(1);  // seq_cst: ordered before the load of sleepers_ (see worker_wait)
    if (sleepers_.load() > 0) {
      std::lock_guard lock(mutex_);
      wake_.notify_all();
    }
  }

  void run_indices() {
    for (;;) {
      const std::size_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= job_size_) return;
      try {
        (*job_)(i);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
        next_.store(job_size_, std::memory_order_relaxed);  // stop handing out work
      }
    }
  }

  /// Returns once the generation differs from `seen`: polls, then sleeps.
  std::uint64_t worker_wait(std::uint64_t seen) {
    auto changed = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!polling::spin_until(spin_, gate_, changed)) {
      std::unique_lock lock(mutex_);
      sleepers_.fetch_add(1);  // seq_cst: publish() sees it, or this thread sees the new generation
      wake_.wait(lock, [&] { return generation_.load() != seen; });
      sleepers_.fetch_sub(1);
    }
    return generation_.load(std::memory_order_acquire);
  }

  void worker_loop() {
    std::uint64_t seen = 0;
    for (;;) {
      seen = worker_wait(seen);
      if (stopping_.load()) return;
      run_indices();
      if (pending_.fetch_sub(1) == 1 && caller_sleeps_.load()) {
        std::lock_guard lock(mutex_);
        done_.notify_one();
      }
    }
  }

  void wait_for_workers() {
    auto all_done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
    if (polling::spin_until(spin_, gate_, all_done)) return;
    std::unique_lock lock(mutex_);
    caller_sleeps_.store(true);  // seq_cst, against the last worker's fetch_sub and load
    done_.wait(lock, [&] { return pending_.load() == 0; });
    caller_sleeps_.store(false);
  }

  std::vector<std::thread> workers_;
  std::chrono::microseconds spin_{0};
  polling::SpinGate gate_;
  std::mutex mutex_;  // guards error_ and the sleeps
  std::condition_variable wake_, done_;
  const std::function<void(std::size_t)>* job_ = nullptr;  // published by generation_
  std::size_t job_size_ = 0;
  std::exception_ptr error_;
  std::atomic<std::size_t> next_{0};
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<unsigned> pending_{0};  // workers still in the current job
  std::atomic<unsigned> sleepers_{0};
  std::atomic<bool> caller_sleeps_{false}, stopping_{false};
};

}  // namespace kvdrive
