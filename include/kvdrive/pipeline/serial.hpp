// pipeline::Serial: one stage after another for the whole batch: select (streams in parallel),
// classify, fetch (the batch's reads in flight together), compute (streams in parallel), commit:
// the reference every other pipeline must match bit for bit. The one overlap it allows itself
// is inside a stage's own data: where the step can (fetch_start/fetch_finish, compute_ready),
// the splits whose pages are all resident are attended while the misses are read.
#pragma once

#include <chrono>
#include <cstddef>
#include <string_view>

#include "kvdrive/pipeline/concept.hpp"

namespace kvdrive::pipeline {

struct Serial {
  static constexpr std::string_view name() { return "serial"; }

  template <StepStages S>
  void run(S& s) const {
    const std::size_t n = s.streams();
    StageTimes& t = s.times();
    const auto t0 = std::chrono::steady_clock::now();
    timed(t.select_ms, [&] { select_range(s, 0, n); });
    timed(t.classify_ms, [&] {
      for (std::size_t i = 0; i < n; ++i) s.classify(i);
    });
    if constexpr (EarlyCompute<S>) {
      // Every miss of the batch in flight at once; meanwhile the resident splits are attended.
      // (If compute_ready throws, attend()'s rollback waits for the reads in flight.)
      timed(t.fetch_ms, [&] { s.fetch_start(0, n); });
      timed(t.compute_ms, [&] { s.compute_ready(0, n); });
      timed(t.fetch_ms, [&] { s.fetch_finish(0, n); });
    } else {
      timed(t.fetch_ms, [&] {
        if constexpr (RangeFetch<S>) s.fetch_range(0, n);  // every miss of the batch in flight at once
        else
          for (std::size_t i = 0; i < n; ++i) s.fetch(i);
      });
    }
    t.overlap_ms += t.select_ms + t.classify_ms + t.fetch_ms;
    timed(t.compute_ms, [&] { s.compute(0, n); });
    timed(t.commit_ms, [&] { s.commit(); });
    t.wall_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  /// Selects streams [a, b): in one call where the stages have select_range, else in parallel.
  template <class S>
  static void select_range(S& s, std::size_t a, std::size_t b) {
    if constexpr (RangeSelect<S>) s.select_range(a, b);
    else s.parallel_for(b - a, [&](std::size_t j) { s.select(a + j); });
  }

 private:
  template <class F>
  static void timed(double& ms, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};
static_assert(PipelinePolicy<Serial>);

}  // namespace kvdrive::pipeline
