// bench_tier's shared pieces: its options (the command line of bench_tier.cpp), page-aligned
// destination buffers as the host pool hands them out, and a stopwatch. The reports of the remote
// tier (tier_remote.hpp) and of semantic packing (tier_packing.hpp) read them too.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/page_key.hpp"

namespace kvdrive::bench_tier {

using namespace kvdrive::tier;  // the tiers under test, unqualified in every report

struct Options {
  std::string dir = std::filesystem::temp_directory_path().string();
  std::size_t pages = 65536;
  std::size_t batch = 256;
  unsigned qd = 64;
  int rounds = 3;
  int pack_layers = 2;                // packing report: layers of the synthetic trace
  std::int64_t pack_context = 16384;  // packing report: prompt tokens
  std::int64_t pack_steps = 64;       // packing report: decode steps
  std::string json;                   // also write the figures as JSON here
  std::size_t remote_pages = 32768;   // remote tier: pages stored on the Redis server (128 MiB)
  std::string redis;                  // remote tier: a server to use (default: start a private one)
  bool skip_ssd = false;              // only the remote tier and packing reports
};

/// n pages of 4 KiB, 4096-aligned, as the host pool hands them out (so SsdTier reads into them
/// directly, without its bounce buffer).
class AlignedPages {
 public:
  explicit AlignedPages(std::size_t n) {
    void* m = nullptr;
    KVD_EXPECT(::posix_memalign(&m, 4096, std::max<std::size_t>(1, n) * 4096) == 0, "bench_tier: out of memory");
    mem_.reset(static_cast<std::byte*>(m));
  }
  std::byte* operator[](std::size_t i) const { return mem_.get() + i * 4096; }

 private:
  std::unique_ptr<std::byte, decltype(&std::free)> mem_{nullptr, &std::free};
};

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace kvdrive::bench_tier
