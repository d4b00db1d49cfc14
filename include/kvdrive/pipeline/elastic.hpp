// pipeline::Elastic: KVDrive's selection-fetching-computation disaggregation on the CPU. A step's
// streams (sequence x KV head of one layer) are split into micro-batches of `micro_batch`
// streams. While micro-batch i is selected (on the caller's thread, streams in parallel on the
// backend's pool), micro-batch i-1 is classified into hits and misses (a stage thread) and
// micro-batch i-2 is fetched (another stage thread); the stages hand micro-batches on through
// counters under one mutex, a queue as deep as the step; the fetch thread keeps every classified
// micro-batch's reads in flight (fetch_start) and finishes them in order (fetch_finish). On the
// CPU the caller's thread, once it has selected every micro-batch, computes each one as soon as
// it is fetched, and attends the resident splits of those still being read (compute_ready)
// meanwhile (compute_as_fetched; with it off, the whole batch computes once every fetch is
// done, as a GPU would in one launch). After the last fetch the fetch thread writes the step's
// sealed pages and prepares the index update (StepStages::prepare_commit, when the stages have
// it) while compute goes on; then commit applies.
//
// Every stage function sees exactly the inputs it sees under Serial, so the results are bitwise
// identical for any micro-batch size. An exception in any stage stops the others at their next
// micro-batch; run() waits for both stage threads to go idle and rethrows the first one, so
// attend() rolls the step back (Decision 8). The two stage threads live as long as the policy
// object (a copy starts its own) and are joined by its destructor.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>

#include "kvdrive/core/error.hpp"
#include "kvdrive/pipeline/concept.hpp"
#include "kvdrive/pipeline/serial.hpp"

namespace kvdrive::pipeline {

/// A thread that runs one posted job at a time. Jobs must not throw.
class StageThread {
 public:
  StageThread() : thread_([this] { loop(); }) {}
  StageThread(const StageThread&) = delete;
  StageThread& operator=(const StageThread&) = delete;
  ~StageThread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  void post(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      job_ = std::move(job);
      busy_ = true;
    }
    wake_.notify_all();
  }

  /// Blocks until the posted job has finished.
  void wait() {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return !busy_; });
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || (busy_ && job_); });
        if (stop_ && !busy_) return;
        job = std::exchange(job_, nullptr);
      }
      job();
      {
        std::lock_guard lock(mutex_);
        busy_ = false;
      }
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::function<void()> job_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

struct ElasticParams {
  /// Streams per micro-batch; 0 chooses ceil(streams / 4) (four micro-batches a step).
  std::size_t micro_batch = 0;
  /// Compute each micro-batch as soon as it is fetched, between selections, so the CPU works
  /// while later micro-batches are read. false: the whole batch computes once every fetch is
  /// done (the GPU design, one attention launch per step).
  bool compute_as_fetched = true;
};

class Elastic {
 public:
  using Params = ElasticParams;

  Elastic() = default;
  explicit Elastic(Params p) : params_(p) {}
  Elastic(const Elastic& o) : params_(o.params_) {}  // the stage threads are not shared
  Elastic& operator=(const Elastic& o) {
    params_ = o.params_;
    return *this;
  }

  static constexpr std::string_view name() { return "elastic"; }
  const Params& params() const { return params_; }
  void set_micro_batch(std::size_t streams) { params_.micro_batch = streams; }

  /// Streams per micro-batch for a step of n streams.
  std::size_t micro_batch_for(std::size_t n) const {
    const std::size_t mb = params_.micro_batch ? params_.micro_batch : (n + 3) / 4;
    return std::clamp<std::size_t>(mb, 1, std::max<std::size_t>(1, n));
  }

  template <StepStages S>
  void run(S& s) const {
    const MicroBatches mbs{s.streams(), micro_batch_for(s.streams())};
    if (mbs.count <= 1) return Serial{}.run(s);  // nothing to overlap: no hand-offs between threads
    StepRun<S> step(s, mbs, threads(), params_.compute_as_fetched);
    step.run();
  }

 private:
  /// The micro-batches of a step of n streams: [first(b), last(b)) for b < count.
  struct MicroBatches {
    std::size_t n, size, count;
    MicroBatches(std::size_t streams, std::size_t mb) : n(streams), size(mb), count(streams == 0 ? 0 : (streams + mb - 1) / mb) {}
    std::size_t first(std::size_t b) const { return b * size; }
    std::size_t last(std::size_t b) const { return std::min(n, (b + 1) * size); }
  };

  struct Threads;
  struct Progress;

  /// One step through the stage threads, and the figures it records.
  template <class S>
  struct StepRun;
  struct Threads {
    StageThread classify, fetch;
  };

  /// How far each stage has come this step, and the first error.
  struct Progress {
    std::mutex mutex;
    std::condition_variable moved;
    std::size_t selected = 0, classified = 0, started = 0, fetched = 0;  ///< started: reads in flight (fetch_start)
    std::chrono::steady_clock::time_point fetched_at{};                  ///< when the last fetch so far finished
    bool stopping = false;
    std::exception_ptr error;

    void advance(std::size_t& counter) {
      {
        std::lock_guard lock(mutex);
        ++counter;
        if (&counter == &fetched) fetched_at = std::chrono::steady_clock::now();
      }
      moved.notify_all();
    }
    void stop() {
      {
        std::lock_guard lock(mutex);
        stopping = true;
      }
      moved.notify_all();
    }
    bool stopped() {
      std::lock_guard lock(mutex);
      return stopping;
    }
    bool reached(const std::size_t& counter, std::size_t target) {
      std::lock_guard lock(mutex);
      return counter >= target;
    }
    /// Waits until counter reaches `target` or the step stops; returns false if it stopped.
    bool wait_for(const std::size_t& counter, std::size_t target) {
      std::unique_lock lock(mutex);
      moved.wait(lock, [&] { return stopping || counter >= target; });
      return !stopping && counter >= target;
    }
    /// Runs f, adding its wall time to busy_ms; an exception stops the step and is kept.
    /// Returns whether f succeeded.
    template <class F>
    bool run(double& busy_ms, F&& f) {
      const auto t0 = std::chrono::steady_clock::now();
      bool ok = true;
      try {
        f();
      } catch (...) {
        ok = false;
        {
          std::lock_guard lock(mutex);
          if (!error) error = std::current_exception();
          stopping = true;
        }
        moved.notify_all();
      }
      busy_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return ok;
    }
    void rethrow() {
      std::lock_guard lock(mutex);
      if (error) std::rethrow_exception(error);
    }
  };

  /// One stage over the micro-batches: waits for each to be ready upstream, runs it, hands it on.
  template <class F>
  static void stage_loop(Progress& prog, std::size_t batches, const std::size_t& ready, std::size_t& done, double& busy_ms, double& wait_ms, F&& f) {
    for (std::size_t b = 0; b < batches; ++b) {
      const auto t0 = std::chrono::steady_clock::now();
      const bool go = prog.wait_for(ready, b + 1);
      wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!go || !prog.run(busy_ms, [&] { f(b); })) return;  // a failed micro-batch is never handed on
      prog.advance(done);
    }
  }

  /// The fetch stage over asynchronous reads: starts every classified micro-batch's reads as
  /// soon as it can, so several micro-batches are read at once, and finishes them in order,
  /// handing each on to compute. On a stop it still finishes what it started: no read is in
  /// flight when the step unwinds.
  template <class S>
  static void fetch_loop(S& s, Progress& prog, const MicroBatches& mbs, double& busy_ms, double& wait_ms) {
    const std::size_t batches = mbs.count;
    const auto first = [&](std::size_t b) { return mbs.first(b); };
    const auto last = [&](std::size_t b) { return mbs.last(b); };
    std::size_t started = 0, finished = 0;
    while (finished < batches && !prog.stopped()) {
      while (started < batches && prog.reached(prog.classified, started + 1) && !prog.stopped()) {
        const bool ok = prog.run(busy_ms, [&] { s.fetch_start(first(started), last(started)); });
        ++started;  // even if it failed: what it did start must be finished
        if (!ok) break;
        prog.advance(prog.started);
      }
      if (prog.stopped()) break;
      if (finished < started) {
        const bool ok = prog.run(busy_ms, [&] { s.fetch_finish(first(finished), last(finished)); });
        ++finished;
        if (!ok) break;  // never handed on to compute
        prog.advance(prog.fetched);
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      prog.wait_for(prog.classified, started + 1);
      wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    for (; finished < started; ++finished) {
      try {
        s.fetch_finish(first(finished), last(finished));
      } catch (...) {  // the step has already failed; this read's error adds nothing
      }
    }
  }

  template <class S>
  struct StepRun {
    StepRun(S& stages, MicroBatches m, Threads& threads, bool as_fetched) : s(stages), mbs(m), w(threads), compute_as_fetched(as_fetched) {}

    S& s;
    MicroBatches mbs;
    Threads& w;
    bool compute_as_fetched;
    Progress prog;
    double classify_busy = 0, classify_wait = 0, fetch_busy = 0, fetch_wait = 0, prepare_busy = 0, select_busy = 0, compute_busy = 0;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    /// With asynchronous fetches and compute_ready, a micro-batch whose reads are in flight has
    /// its resident splits attended meanwhile; a fetched one is computed first.
    static constexpr bool kReadyEarly = EarlyCompute<S>;

    void run() {
      // Whatever happens below, both stage threads are idle before run() returns (their jobs use
      // this object).
      struct Join {
        StepRun& r;
        ~Join() { r.stop_stages(); }
      } join{*this};
      start_stages();
      // The caller's thread selects micro-batch after micro-batch (selection feeds the reads,
      // the long pole, so it goes first); then, with compute_as_fetched, it computes each one as
      // soon as it is fetched, while the later ones are still being read.
      for (std::size_t b = 0; b < mbs.count && !prog.stopped(); ++b) {
        if (!prog.run(select_busy, [&] { Serial::select_range(s, mbs.first(b), mbs.last(b)); })) break;  // never handed on
        prog.advance(prog.selected);
      }
      if (compute_as_fetched) compute_fetched();
      if (!prog.wait_for(prog.fetched, mbs.count)) {  // a stage failed: let the others go idle first
        stop_stages();
        prog.rethrow();
        fail("pipeline::Elastic: the step stopped without an error");
      }
      record_fetch_figures();
      if (!compute_as_fetched) (void)prog.run(compute_busy, [&] { s.compute(0, mbs.n); });
      w.fetch.wait();  // prepare_commit
      prog.rethrow();
      finish();
    }

    void stop_stages() {
      prog.stop();
      w.fetch.wait();
      w.classify.wait();
    }

    /// The classify thread hands micro-batches on to the fetch thread, which then prepares the
    /// commit (the sealed pages' writes overlap compute).
    void start_stages() {
      w.classify.post([this] {
        stage_loop(prog, mbs.count, prog.selected, prog.classified, classify_busy, classify_wait, [this](std::size_t b) {
          for (std::size_t i = mbs.first(b); i < mbs.last(b); ++i) s.classify(i);
        });
      });
      w.fetch.post([this] {
        if constexpr (AsyncFetch<S>) {
          fetch_loop(s, prog, mbs, fetch_busy, fetch_wait);
        } else {
          stage_loop(prog, mbs.count, prog.classified, prog.fetched, fetch_busy, fetch_wait, [this](std::size_t b) {
            if constexpr (RangeFetch<S>) s.fetch_range(mbs.first(b), mbs.last(b));  // the micro-batch's reads in flight together
            else
              for (std::size_t i = mbs.first(b); i < mbs.last(b); ++i) s.fetch(i);
          });
        }
        if constexpr (PreparedCommit<S>) {
          if (!prog.stopped()) prog.run(prepare_busy, [this] { s.prepare_commit(); });
        }
      });
    }

    /// Computes each micro-batch as soon as it is fetched (and, meanwhile, the resident splits
    /// of those still being read).
    void compute_fetched() {
      std::size_t computed = 0, readied = 0;
      while (computed < mbs.count && !prog.stopped()) {
        bool full = true;
        {
          std::unique_lock lock(prog.mutex);
          prog.moved.wait(lock,
                          [&] { return prog.stopping || prog.fetched > computed || (kReadyEarly && readied < mbs.count && prog.started > readied); });
          if (prog.stopping) return;
          full = prog.fetched > computed;
        }
        if (full) {
          if (!prog.run(compute_busy, [&] { s.compute(mbs.first(computed), mbs.last(computed)); })) return;
          ++computed;
          readied = std::max(readied, computed);
        } else if constexpr (kReadyEarly) {
          if (!prog.run(compute_busy, [&] { s.compute_ready(mbs.first(readied), mbs.last(readied)); })) return;
          ++readied;
        }
      }
    }

    /// Every micro-batch is fetched: the classify thread is done and the fetch thread has moved
    /// on to prepare_commit, which touches none of the figures below.
    void record_fetch_figures() {
      const auto fetched_at = [&] {
        std::lock_guard lock(prog.mutex);
        return prog.fetched_at;
      }();
      StageTimes& t = s.times();
      t.select_ms += select_busy;
      t.classify_ms += classify_busy;
      t.fetch_ms += fetch_busy;
      t.classify_wait_ms += classify_wait;
      t.fetch_wait_ms += fetch_wait;
      t.overlap_ms += std::chrono::duration<double, std::milli>(fetched_at - t0).count();
    }

    void finish() {
      StageTimes& t = s.times();
      t.compute_ms += compute_busy;
      double commit_busy = 0;
      prog.run(commit_busy, [&] { s.commit(); });
      prog.rethrow();
      t.commit_ms += commit_busy + prepare_busy;
      t.wall_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
  };

  Threads& threads() const {
    if (!threads_) threads_ = std::make_unique<Threads>();
    return *threads_;
  }

  Params params_;
  mutable std::unique_ptr<Threads> threads_;
};
static_assert(PipelinePolicy<Elastic>);

}  // namespace kvdrive::pipeline
