// Cold-page codecs (codec/cpu_codec.hpp): encode and decode throughput on one thread, in GB/s of
// pages in the KV dtype, beside memcpy of the same pages measured in the same run, and their
// ratio (the codec issue's goal: decode >= 0.5 of memcpy).
//
// Pages: SmolLM2's (8 tokens x head_dim 64, f16: 2 KiB) and Llama-3-8B's (8 x 128: 4 KiB), a
// working set of 64 MiB of pages (past the last-level cache), visited in a shuffled order as a
// decode step's fetched pages would be. decode reads the coded page and writes the page;
// memcpy reads and writes the page. Best of 5 passes each.
//
//   bench_codec [--mib N] [--passes N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvdrive/codec/cpu_codec.hpp"

using namespace kvdrive;

namespace {

template <class F>
double best_seconds(int passes, F&& f) {
  double best = 1e30;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void run(int head_dim, codec::PageCodec pc, std::size_t mib, int passes) {
  const int tokens = 8;
  const codec::CodedLayout l = codec::CodedLayout::make(tokens, head_dim, pc);
  const std::size_t elems = 2 * std::size_t{tokens} * head_dim, page_bytes = elems * sizeof(half);
  const std::size_t pages = (mib << 20) / page_bytes;
  std::vector<half> src(pages * elems), dst(pages * elems);
  std::vector<std::uint8_t> coded(pages * l.bytes);
  std::uint64_t x = 88172645463325252ull;
  for (auto& h : src) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    h = half(static_cast<float>(static_cast<std::int64_t>(x % 2001) - 1000) * 1e-3f);
  }
  std::vector<std::size_t> order(pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  const double enc = best_seconds(passes, [&] {
    for (std::size_t p : order) codec::encode_page(l, src.data() + p * elems, coded.data() + p * l.bytes);
  });
  const double dec = best_seconds(passes, [&] {
    for (std::size_t p : order) codec::decode_page(l, coded.data() + p * l.bytes, dst.data() + p * elems);
  });
  const double copy = best_seconds(passes, [&] {
    for (std::size_t p : order) std::memcpy(dst.data() + p * elems, src.data() + p * elems, page_bytes);
  });
  volatile unsigned sink = static_cast<unsigned>(dst[pages * elems / 2].bits);  // keep the work observable
  (void)sink;
  const double bytes = static_cast<double>(pages * page_bytes), gb = 1e9;
  std::printf(
      "%-5s %-5s %4d x %3d  %5zu -> %4zu B (%.3fx)  encode %6.2f GB/s (%.2f of memcpy)  decode %6.2f GB/s (%.2f of memcpy)  memcpy %6.2f GB/s\n",
      "f16", pc.name().c_str(), tokens, head_dim, page_bytes, l.bytes, static_cast<double>(l.bytes) / static_cast<double>(page_bytes),
      bytes / enc / gb, copy / enc, bytes / dec / gb, copy / dec, bytes / copy / gb);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 64;
  int passes = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mib") mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--passes") passes = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_codec [--mib N] [--passes N]\n");
      return 2;
    }
  }
  if (mib == 0 || passes <= 0) {
    std::fprintf(stderr, "bench_codec: --mib and --passes must be positive\n");
    return 2;
  }
#if KVD_CODEC_AVX2
  std::printf("bench_codec: AVX2 decode, one thread, %zu MiB of pages, best of %d\n", mib, passes);
#else
  std::printf("bench_codec: portable decode, one thread, %zu MiB of pages, best of %d\n", mib, passes);
#endif
  for (int head_dim : {64, 128})
    for (codec::Codec c : {codec::Codec::int8, codec::Codec::int4}) run(head_dim, {c}, mib, passes);
  return 0;
}
