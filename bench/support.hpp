// Shared by the benchmarks: the machine's memcpy bandwidth (the yardstick that memory-bound
// kernels are compared with, in the same run) and a console reporter that remembers each run's
// rate counters so main() can print ratios.
#pragma once

#include <benchmark/benchmark.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kvdrive/core/thread_pool.hpp"

namespace kvdrive::bench {

/// Copies 256 MiB with state.range(0) threads; the "copied" counter is bytes copied per second
/// (each byte is read once and written once).
inline void BM_Memcpy(benchmark::State& state) {
  const std::size_t n = 256u << 20;
  std::vector<char> src(n, 1), dst(n, 0);
  const auto threads = static_cast<unsigned>(state.range(0));
  ThreadPool pool(threads);
  std::size_t bytes = 0;
  for (auto _ : state) {
    pool.parallel_for(threads, [&](std::size_t t) {
      const std::size_t chunk = n / threads;
      std::memcpy(dst.data() + t * chunk, src.data() + t * chunk, chunk);
    });
    benchmark::DoNotOptimize(dst.data());
    bytes += n;
  }
  state.counters["copied"] = benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

/// A rate counter: `amount` per second.
inline benchmark::Counter rate(double amount, bool binary = true) {
  return benchmark::Counter(amount, benchmark::Counter::kIsRate, binary ? benchmark::Counter::kIs1024 : benchmark::Counter::kIs1000);
}

/// Prints the usual table and keeps, per benchmark name, the value of the named rate counters.
class Collect : public benchmark::ConsoleReporter {
 public:
  explicit Collect(std::vector<std::string> counters) : counters_(std::move(counters)) {}
  std::map<std::string, double> rate;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs)
      for (const auto& c : counters_) {
        auto it = r.counters.find(c);
        if (it != r.counters.end()) rate[r.benchmark_name()] = it->second.value;
      }
    ConsoleReporter::ReportRuns(runs);
  }
  bool has(const std::string& name) const { return rate.count(name) != 0; }

 private:
  std::vector<std::string> counters_;
};

}  // namespace kvdrive::bench
