// The thread pool's fork-join, spinning between jobs (ThreadPool::kDefaultSpin) against sleeping
// at once (spin 0: a condition-variable wake per job, as the pool was before it spun), in one run:
//   fork_join/spin_us:S        an empty job of 2 indices, back to back: the barrier's own cost;
//   decode_like/spin_us:S      30 "layers" of 6 jobs, each 2 x ~3 us of arithmetic with ~2 us of
//                              serial work between jobs: the rhythm of a small model's decode step.
// Run with all cores idle: a spinning worker on a busy machine takes a core from the work (the
// pool's header says why a pool spins, and for how long).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "kvdrive/core/thread_pool.hpp"

using namespace kvdrive;

namespace {

/// About `iters` dependent multiply-adds: a few microseconds of work that the optimizer keeps.
double busy(std::uint64_t iters, double x) {
  for (std::uint64_t i = 0; i < iters; ++i) x = x * 0.999999 + 1e-7;
  return x;
}

void fork_join(benchmark::State& state) {
  ThreadPool pool(2, std::chrono::microseconds{state.range(0)});
  for (auto _ : state) pool.parallel_for(2, [](std::size_t) {});
  state.counters["ns_per_join"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void decode_like(benchmark::State& state) {
  ThreadPool pool(2, std::chrono::microseconds{state.range(0)});
  std::vector<double> sink(2, 1.0);
  double serial = 1.0;
  for (auto _ : state) {
    for (int job = 0; job < 30 * 6; ++job) {
      pool.parallel_for(2, [&](std::size_t i) { sink[i] = busy(3000, sink[i]); });
      serial = busy(2000, serial);
    }
  }
  benchmark::DoNotOptimize(sink);
  benchmark::DoNotOptimize(serial);
}

}  // namespace

BENCHMARK(fork_join)->ArgName("spin_us")->Arg(0)->Arg(ThreadPool::kDefaultSpin.count())->UseRealTime();
BENCHMARK(decode_like)->ArgName("spin_us")->Arg(0)->Arg(ThreadPool::kDefaultSpin.count())->UseRealTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
