// The yardstick of the selection floor: one thread's memcpy bandwidth, in bytes copied per
// second (each byte read once and written once), best of three copies of 256 MiB. Shared by
// kvd-eval and bench_index, which print index bytes / this rate beside each selection time.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

namespace kvdrive::bench {

inline double memcpy_bytes_per_second() {
  const std::size_t n = 256u << 20;
  std::vector<char> src(n, 1), dst(n, 0);
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n) / s);
    src[static_cast<std::size_t>(r)] = dst[n - 1 - static_cast<std::size_t>(r)];  // keep the copies observable
  }
  return best;
}

}  // namespace kvdrive::bench
