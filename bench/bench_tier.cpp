// Storage tiers: SsdTier's sparse page reads against the device's own speed, measured side by
// side in one run. A store of `--pages` 4 KiB pages (one stream after another, as decode seals
// them) is written to `--dir`; then each round reads a random 6.25% of them in batches of
// `--batch` pages (what one decode step's misses look like) three ways, in turns:
//   raw      O_DIRECT io_uring reads of the same slots, one 4 KiB read per page, queue depth
//            `--qd`: the device's random-read speed at this block size (the fio figure)
//   ssd      SsdTier::submit/wait on the same pages: merging, checksums and copies included
//   ssd-qd1  SsdTier at queue depth 1, for scale
// O_DIRECT keeps the page cache out of it. Prints pages/s and MB/s and the ratio ssd / raw.
// Then a decode workload (each step reads a random 6.25% of every layer) through SsdTier and
// through MmapTier, the FlexGen-style strawman that loads whole layers (cold each step), and
// MmapTier's sequential bandwidth against O_DIRECT 1 MiB reads of the same bytes.
//
//   bench_tier [--dir PATH] [--pages N] [--batch N] [--qd N] [--rounds N]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/mmap.hpp"

using namespace kvdrive;
using namespace kvdrive::tier;

namespace {

struct Options {
  std::string dir = std::filesystem::temp_directory_path().string();
  std::size_t pages = 65536;
  std::size_t batch = 256;
  unsigned qd = 64;
  int rounds = 3;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir") o.dir = argv[i + 1];
    else if (a == "--pages") o.pages = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--batch") o.batch = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--qd") o.qd = static_cast<unsigned>(std::strtoul(argv[i + 1], nullptr, 10));
    else if (a == "--rounds") o.rounds = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_tier: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    KVD_EXPECT(o.pages >= 64 && o.batch >= 1 && o.qd >= 1 && o.rounds >= 1, "bench_tier: bad options");
    constexpr std::size_t kPage = 4096;
    const std::string path = (std::filesystem::path(o.dir) / "kvd_bench_tier.store").string();
    SsdTier::remove_files(path);
    auto make = [&](unsigned qd) {
      SsdTier::Params p;
      p.path = path;
      p.queue_depth = qd;
      p.alignment = 4096;
      p.extent_pages = 1024;
      return SsdTier(p);
    };
    // The store: 8 streams' pages, written a batch at a time as decode would seal them.
    std::vector<PageKey> keys;
    {
      SsdTier t = make(o.qd);
      t.open({kPage});
      std::vector<std::byte> data(kPage * 256);
      std::mt19937_64 rng(1);
      for (auto& b : data) b = static_cast<std::byte>(rng());
      std::vector<WriteRequest> batch;
      for (std::size_t i = 0; i < o.pages; ++i) {
        keys.push_back({1, static_cast<std::uint32_t>(i % 8), 0, static_cast<std::uint32_t>(i / 8)});
        batch.push_back({keys.back(), data.data() + (i % 256) * kPage});
        if (batch.size() == 256 || i + 1 == o.pages) {
          t.write_batch(batch);
          batch.clear();
        }
      }
    }
    SsdTier ssd = make(o.qd), ssd1 = make(1);
    ssd.open({kPage});
    std::vector<std::uint64_t> offsets(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) offsets[i] = ssd.slot_offset(ssd.slot_of(keys[i]));
    std::printf("bench_tier: %zu pages of 4 KiB in %s (%s, %s), batches of %zu pages, queue depth %u\n", o.pages, path.c_str(),
                std::string(ssd.io_name()).c_str(), ssd.direct_io() ? "O_DIRECT" : "buffered: O_DIRECT refused", o.batch, o.qd);
    const int raw_fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    KVD_EXPECT(raw_fd >= 0, "bench_tier: cannot open {} with O_DIRECT: {}", path, std::strerror(errno));
    IoEngine raw;
    raw.open(IoBackend::automatic, o.qd, 0);
    void* mem = nullptr;
    KVD_EXPECT(::posix_memalign(&mem, 4096, o.batch * kPage) == 0, "bench_tier: out of memory");
    std::byte* buf = static_cast<std::byte*>(mem);
    std::vector<std::vector<std::byte>> dst(o.batch, std::vector<std::byte>(kPage));

    const std::size_t want = std::max<std::size_t>(o.batch, o.pages / 16);  // 6.25% of the pages
    double t_raw = 0, t_ssd = 0, t_ssd1 = 0;
    std::size_t pages_read = 0;
    std::uint64_t ssd_ops = 0;
    for (int round = 0; round < o.rounds; ++round) {
      std::mt19937_64 rng(100 + static_cast<std::uint64_t>(round));
      std::vector<std::size_t> pick(o.pages);
      for (std::size_t i = 0; i < pick.size(); ++i) pick[i] = i;
      std::shuffle(pick.begin(), pick.end(), rng);
      pick.resize(want);
      for (std::size_t at = 0; at < pick.size(); at += o.batch) {
        const std::size_t n = std::min(o.batch, pick.size() - at);
        // raw: one 4 KiB O_DIRECT read per page
        std::vector<IoRead> reads(n);
        for (std::size_t j = 0; j < n; ++j) reads[j] = {offsets[pick[at + j]], kPage, buf + j * kPage, 0};
        auto t0 = std::chrono::steady_clock::now();
        raw.read_all(raw_fd, reads);
        t_raw += seconds_since(t0);
        for (const IoRead& r : reads) KVD_EXPECT(r.result == static_cast<std::int64_t>(kPage), "bench_tier: raw read failed");
        // ssd at the same queue depth, then at depth 1
        std::vector<ReadRequest> req(n);
        for (std::size_t j = 0; j < n; ++j) req[j] = {keys[pick[at + j]], dst[j].data()};
        const std::uint64_t ops0 = ssd.read_ops();
        t0 = std::chrono::steady_clock::now();
        ssd.wait(ssd.submit(req));
        t_ssd += seconds_since(t0);
        ssd_ops += ssd.read_ops() - ops0;
        if (round == 0) {
          if (at == 0) ssd1.open({kPage});
          t0 = std::chrono::steady_clock::now();
          ssd1.wait(ssd1.submit(req));
          t_ssd1 += seconds_since(t0);
        }
        pages_read += n;
      }
    }
    ::close(raw_fd);
    std::free(mem);
    const double mb = static_cast<double>(pages_read) * kPage / 1e6;
    std::printf("%-10s %12s %10s %14s\n", "reader", "pages/s", "MB/s", "vs raw");
    std::printf("%-10s %12.0f %10.1f %14s\n", "raw", static_cast<double>(pages_read) / t_raw, mb / t_raw, "1 (the device)");
    std::printf("%-10s %12.0f %10.1f %14.3f\n", "ssd", static_cast<double>(pages_read) / t_ssd, mb / t_ssd, t_raw / t_ssd);
    const double mb1 = static_cast<double>(want) * kPage / 1e6;
    std::printf("%-10s %12.0f %10.1f %14s\n", "ssd-qd1", static_cast<double>(want) / t_ssd1, mb1 / t_ssd1, "(round 1 only)");
    std::printf("ssd merged %zu page reads into %llu I/Os (adjacent slots)\n", pages_read, static_cast<unsigned long long>(ssd_ops));

    // A decode workload against the FlexGen-style strawman: the store's 8 streams are 8 layers;
    // each step reads a random 6.25% of every layer's pages (its misses). MmapTier loads each
    // layer whole; its page cache is dropped before every step, as when the KV outgrows DRAM.
    const std::string mpath = (std::filesystem::path(o.dir) / "kvd_bench_tier.mmap").string();
    {
      MmapTier mm(MmapTier::Params{mpath, o.pages});
      mm.open({kPage});
      std::vector<std::byte> page(kPage);
      std::vector<PageKey> by_layer = keys;  // FlexGen keeps a layer's KV together
      std::stable_sort(by_layer.begin(), by_layer.end(), [](const PageKey& a, const PageKey& b) { return a.layer < b.layer; });
      for (const PageKey& k : by_layer) {
        const ReadRequest r{k, page.data()};
        ssd.wait(ssd.submit(std::span<const ReadRequest>(&r, 1)));
        mm.write(k, page.data());
      }
      const int steps = 4;
      const std::size_t per_layer = o.pages / 8;
      // Misses per layer-step: all selected pages (no cache), or what a Lookahead W = 3 cache
      // leaves (12.3%: its measured miss rate on the default trace, docs/eviction.md).
      for (const double miss_rate : {1.0, 0.123}) {
        const std::size_t misses = std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(per_layer / 16) * miss_rate));
        double t_ssd_dec = 0, t_mm_dec = 0;
        std::mt19937_64 rng(7);
        std::vector<std::vector<std::byte>> out(misses, std::vector<std::byte>(kPage));
        for (int step = 0; step < steps; ++step)
          for (std::uint32_t layer = 0; layer < 8; ++layer) {
            std::vector<ReadRequest> req;
            std::set<std::uint32_t> chosen;
            while (chosen.size() < misses) chosen.insert(static_cast<std::uint32_t>(rng() % per_layer));
            std::size_t j = 0;
            for (std::uint32_t pg : chosen) req.push_back({{1, layer, 0, pg}, out[j++].data()});
            auto t0 = std::chrono::steady_clock::now();
            ssd.wait(ssd.submit(req));
            t_ssd_dec += seconds_since(t0);
            mm.drop_cache();
            t0 = std::chrono::steady_clock::now();
            mm.wait(mm.submit(req));
            t_mm_dec += seconds_since(t0);
          }
        std::printf("decode workload, %s (%d steps x 8 layers, %zu of %zu pages read per layer): ssd %.1f ms/step, mmap %.1f ms/step: "
                    "ssd %.1fx faster\n",
                    miss_rate == 1.0 ? "no cache: every selected page (6.25%)" : "the misses a Lookahead W=3 cache leaves", steps, misses,
                    per_layer, 1e3 * t_ssd_dec / steps, 1e3 * t_mm_dec / steps, t_mm_dec / t_ssd_dec);
      }
      const double layer_mb = static_cast<double>(per_layer * kPage) / 1e6;
      // Sequential bandwidth: MmapTier's cold whole-layer loads against O_DIRECT 1 MiB reads.
      const int seq_fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
      KVD_EXPECT(seq_fd >= 0, "bench_tier: cannot reopen {}", path);
      const std::size_t chunk = 1 << 20, total = o.pages * kPage;
      void* big = nullptr;
      KVD_EXPECT(::posix_memalign(&big, 4096, 8 * chunk) == 0, "bench_tier: out of memory");
      std::vector<IoRead> seq;
      auto t0 = std::chrono::steady_clock::now();
      for (std::size_t off = 0; off < total; off += 8 * chunk) {
        seq.clear();
        for (std::size_t k = 0; k < 8 && off + k * chunk < total; ++k)
          seq.push_back({4096 + off + k * chunk, std::min(chunk, total - off - k * chunk), static_cast<std::byte*>(big) + k * chunk, 0});
        raw.read_all(seq_fd, seq);
      }
      const double t_seq = seconds_since(t0);
      ::close(seq_fd);
      std::free(big);
      mm.drop_cache();
      std::vector<std::byte> one(kPage);
      t0 = std::chrono::steady_clock::now();
      for (std::uint32_t layer = 0; layer < 8; ++layer) {
        const ReadRequest r{{1, layer, 0, 0}, one.data()};
        mm.wait(mm.submit(std::span<const ReadRequest>(&r, 1)));
      }
      const double t_mm_seq = seconds_since(t0);
      std::printf("sequential: O_DIRECT 1 MiB reads %.0f MB/s; mmap whole-layer loads (cold) %.0f MB/s = %.2f of the device\n",
                  static_cast<double>(total) / 1e6 / t_seq, 8 * layer_mb / t_mm_seq, (8 * layer_mb / t_mm_seq) / (static_cast<double>(total) / 1e6 / t_seq));
    }
    std::filesystem::remove(mpath);
    SsdTier::remove_files(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tier: %s\n", e.what());
    return 1;
  }
  return 0;
}
