// Storage tiers: SsdTier's sparse page reads against the device's own speed, measured side by
// side in one run. A store of `--pages` 4 KiB pages (one stream after another, as decode seals
// them) is written to `--dir`; then each round reads a random 6.25% of them in batches of
// `--batch` pages (what one decode step's misses look like) three ways, in turns:
//   raw      O_DIRECT io_uring reads of the same slots, one 4 KiB read per page, queue depth
//            `--qd`: the device's random-read speed at this block size (the fio figure)
//   ssd      SsdTier::submit/wait on the same pages: merging, checksums and copies included
//   ssd-reg  the same into buffers registered with io_uring (fixed reads), as KvManager's fast tier
//   ssd-qd1  SsdTier at queue depth 1, for scale
// O_DIRECT keeps the page cache out of it. Prints pages/s and MB/s and the ratio ssd / raw.
// Then a decode workload (each step reads a random 6.25% of every layer) through SsdTier and
// through MmapTier, the FlexGen-style strawman that loads whole layers (cold each step), and
// MmapTier's sequential bandwidth against O_DIRECT 1 MiB reads of the same bytes.
//
// Then the remote tier (RedisTier) over loopback, against redis-benchmark's GET at the same
// value size, pipeline depth and one connection, in the same run (see remote_report in
// tier_remote.hpp); it starts a private redis-server (or uses --redis URL) and is skipped where
// Redis is not installed.
//
// Last, semantic packing against seal order on the misses of a Lookahead W=3 cache (see
// packing_report in tier_packing.hpp).
//
//   bench_tier [--dir PATH] [--pages N] [--batch N] [--qd N] [--rounds N]
//              [--pack-layers N] [--pack-context TOKENS] [--pack-steps N] [--json FILE]
//              [--remote-pages N] [--redis URL] [--skip-ssd]
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
#include <span>
#include <string>
#include <vector>

#include <fstream>

#include <nlohmann/json.hpp>

#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/mmap.hpp"
#include "tier_common.hpp"
#include "tier_packing.hpp"
#include "tier_remote.hpp"

using namespace kvdrive;
using namespace kvdrive::tier;
using namespace kvdrive::bench_tier;

namespace {

constexpr std::size_t kPage = 4096;

/// Reads the command line into o; false, said on stderr, at an unknown option.
bool parse_options(int argc, char** argv, Options& o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir") o.dir = argv[i + 1];
    else if (a == "--pages") o.pages = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--batch") o.batch = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--qd") o.qd = static_cast<unsigned>(std::strtoul(argv[i + 1], nullptr, 10));
    else if (a == "--rounds") o.rounds = std::atoi(argv[i + 1]);
    else if (a == "--pack-layers") o.pack_layers = std::atoi(argv[i + 1]);
    else if (a == "--pack-context") o.pack_context = std::strtoll(argv[i + 1], nullptr, 10);
    else if (a == "--pack-steps") o.pack_steps = std::strtoll(argv[i + 1], nullptr, 10);
    else if (a == "--json") o.json = argv[i + 1];
    else if (a == "--remote-pages") o.remote_pages = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--redis") o.redis = argv[i + 1];
    else if (a == "--skip-ssd") o.skip_ssd = std::string(argv[i + 1]) == "1";
    else {
      std::fprintf(stderr, "bench_tier: unknown option %s\n", a.c_str());
      return false;
    }
  }
  return true;
}

SsdTier make_ssd(const std::string& path, unsigned qd, SsdOpen mode = SsdOpen::open_or_create) {
  SsdTier::Params p;
  p.path = path;
  p.mode = mode;
  p.queue_depth = qd;
  p.alignment = 4096;
  p.extent_pages = 1024;
  return SsdTier(p);
}

/// The store: 8 streams' pages, written a batch at a time as decode would seal them. Returns
/// their keys, in the order written.
std::vector<PageKey> write_store(const Options& o, const std::string& path) {
  std::vector<PageKey> keys;
  SsdTier t = make_ssd(path, o.qd);
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
  return keys;
}

/// The random-read comparison: each round reads a random 6.25% of the store's pages, in batches
/// of --batch, four ways in turns: raw O_DIRECT reads of the same slots, SsdTier, SsdTier into
/// registered buffers, and (first round only) SsdTier at queue depth 1.
class RandomReads {
 public:
  RandomReads(const Options& o, const std::string& path, const std::vector<PageKey>& keys, SsdTier& ssd, SsdTier& ssd1, SsdTier& ssd_reg,
              IoEngine& raw)
      : o_(o),
        keys_(keys),
        ssd_(ssd),
        ssd1_(ssd1),
        ssd_reg_(ssd_reg),
        raw_(raw),
        dst_reg_(o.batch),
        buf_(o.batch),
        dst_(o.batch),
        want_(std::max<std::size_t>(o.batch, o.pages / 16)) {             // 6.25% of the pages
    registered_ = ssd_reg.register_memory(dst_reg_[0], o.batch * kPage);  // registered with ssd_reg's ring, as KvManager does with its fast tier
    offsets_.resize(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) offsets_[i] = ssd.slot_offset(ssd.slot_of(keys[i]));
    raw_fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    KVD_EXPECT(raw_fd_ >= 0, "bench_tier: cannot open {} with O_DIRECT: {}", path, std::strerror(errno));
  }
  RandomReads(const RandomReads&) = delete;
  RandomReads& operator=(const RandomReads&) = delete;
  ~RandomReads() { ::close(raw_fd_); }

  void run() {
    for (int round = 0; round < o_.rounds; ++round) {
      std::mt19937_64 rng(100 + static_cast<std::uint64_t>(round));
      std::vector<std::size_t> pick(o_.pages);
      for (std::size_t i = 0; i < pick.size(); ++i) pick[i] = i;
      std::shuffle(pick.begin(), pick.end(), rng);
      pick.resize(want_);
      for (std::size_t at = 0; at < pick.size(); at += o_.batch)
        read_batch(std::span<const std::size_t>(pick).subspan(at, std::min(o_.batch, pick.size() - at)), round == 0, at == 0);
    }
  }

  /// The table, and the figures as the report's JSON.
  nlohmann::json report() const {
    const double mb = static_cast<double>(pages_read_) * kPage / 1e6;
    std::printf("%-10s %12s %10s %14s\n", "reader", "pages/s", "MB/s", "vs raw");
    std::printf("%-10s %12.0f %10.1f %14s\n", "raw", static_cast<double>(pages_read_) / t_raw_, mb / t_raw_, "1 (the device)");
    std::printf("%-10s %12.0f %10.1f %14.3f\n", "ssd", static_cast<double>(pages_read_) / t_ssd_, mb / t_ssd_, t_raw_ / t_ssd_);
    std::printf("%-10s %12.0f %10.1f %14.3f  (%s; %llu fixed reads)\n", "ssd-reg", static_cast<double>(pages_read_) / t_reg_, mb / t_reg_,
                t_raw_ / t_reg_, registered_ ? "destination buffers registered with io_uring" : "registration refused here: plain reads",
                static_cast<unsigned long long>(ssd_reg_.fixed_reads()));
    const double mb1 = static_cast<double>(want_) * kPage / 1e6;
    std::printf("%-10s %12.0f %10.1f %14s\n", "ssd-qd1", static_cast<double>(want_) / t_ssd1_, mb1 / t_ssd1_, "(round 1 only)");
    std::printf("ssd merged %zu page reads into %llu I/Os (adjacent slots)\n", pages_read_, static_cast<unsigned long long>(ssd_ops_));
    return {{"pages", o_.pages},
            {"batch", o_.batch},
            {"queue_depth", o_.qd},
            {"io", std::string(ssd_.io_name())},
            {"direct_io", ssd_.direct_io()},
            {"random_4k_mb_per_s", {{"raw", mb / t_raw_}, {"ssd", mb / t_ssd_}, {"ssd_registered", mb / t_reg_}, {"ssd_qd1", mb1 / t_ssd1_}}}};
  }

 private:
  /// One batch of pages (indices into the keys) read each way, each timed.
  void read_batch(std::span<const std::size_t> pages, bool first_round, bool first_batch) {
    const std::size_t n = pages.size();
    // raw: one 4 KiB O_DIRECT read per page
    std::vector<IoRead> reads(n);
    for (std::size_t j = 0; j < n; ++j) reads[j] = {offsets_[pages[j]], kPage, buf_[j], 0};
    auto t0 = std::chrono::steady_clock::now();
    raw_.read_all(raw_fd_, reads);
    t_raw_ += seconds_since(t0);
    for (const IoRead& r : reads) KVD_EXPECT(r.result == static_cast<std::int64_t>(kPage), "bench_tier: raw read failed");
    // ssd at the same queue depth, then at depth 1
    std::vector<ReadRequest> req(n);
    for (std::size_t j = 0; j < n; ++j) req[j] = {keys_[pages[j]], dst_[j]};
    const std::uint64_t ops0 = ssd_.read_ops();
    t0 = std::chrono::steady_clock::now();
    ssd_.wait(ssd_.submit(req));
    t_ssd_ += seconds_since(t0);
    ssd_ops_ += ssd_.read_ops() - ops0;
    // ssd into registered buffers (fixed reads)
    for (std::size_t j = 0; j < n; ++j) req[j].dst = dst_reg_[j];
    t0 = std::chrono::steady_clock::now();
    ssd_reg_.wait(ssd_reg_.submit(req));
    t_reg_ += seconds_since(t0);
    for (std::size_t j = 0; j < n; ++j) req[j].dst = dst_[j];
    if (first_round) {
      if (first_batch) ssd1_.open({kPage});
      t0 = std::chrono::steady_clock::now();
      ssd1_.wait(ssd1_.submit(req));
      t_ssd1_ += seconds_since(t0);
    }
    pages_read_ += n;
  }

  const Options& o_;
  const std::vector<PageKey>& keys_;
  SsdTier &ssd_, &ssd1_, &ssd_reg_;
  IoEngine& raw_;
  const AlignedPages dst_reg_, buf_, dst_;  // buf_: raw's destination
  const std::size_t want_;
  bool registered_ = false;
  std::vector<std::uint64_t> offsets_;
  int raw_fd_ = -1;
  double t_raw_ = 0, t_ssd_ = 0, t_ssd1_ = 0, t_reg_ = 0;
  std::size_t pages_read_ = 0;
  std::uint64_t ssd_ops_ = 0;
};

/// The store's pages copied into mm, layer after layer.
void fill_mmap(const std::vector<PageKey>& keys, SsdTier& ssd, MmapTier& mm) {
  std::vector<std::byte> page(kPage);
  std::vector<PageKey> by_layer = keys;  // FlexGen keeps a layer's KV together
  std::stable_sort(by_layer.begin(), by_layer.end(), [](const PageKey& a, const PageKey& b) { return a.layer < b.layer; });
  for (const PageKey& k : by_layer) {
    const ReadRequest r{k, page.data()};
    ssd.wait(ssd.submit(std::span<const ReadRequest>(&r, 1)));
    mm.write(k, page.data());
  }
}

/// One decode workload: 4 steps of 8 layers, each layer-step reading `miss_rate` of a random
/// 6.25% of the layer's pages through SsdTier and through MmapTier (its page cache dropped first).
void decode_workload(const Options& o, double miss_rate, SsdTier& ssd, MmapTier& mm, nlohmann::json& result) {
  const int steps = 4;
  const std::size_t per_layer = o.pages / 8;
  const std::size_t misses = std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(per_layer / 16) * miss_rate));
  double t_ssd_dec = 0, t_mm_dec = 0;
  std::mt19937_64 rng(7);
  const AlignedPages out(misses);
  for (int step = 0; step < steps; ++step)
    for (std::uint32_t layer = 0; layer < 8; ++layer) {
      std::vector<ReadRequest> req;
      std::set<std::uint32_t> chosen;
      while (chosen.size() < misses) chosen.insert(static_cast<std::uint32_t>(rng() % per_layer));
      std::size_t j = 0;
      for (std::uint32_t pg : chosen) req.push_back({{1, layer, 0, pg}, out[j++]});
      auto t0 = std::chrono::steady_clock::now();
      ssd.wait(ssd.submit(req));
      t_ssd_dec += seconds_since(t0);
      mm.drop_cache();
      t0 = std::chrono::steady_clock::now();
      mm.wait(mm.submit(req));
      t_mm_dec += seconds_since(t0);
    }
  result["decode_workload"].push_back({{"misses_per_layer", misses},
                                       {"miss_rate", miss_rate},
                                       {"ssd_ms_per_step", 1e3 * t_ssd_dec / steps},
                                       {"mmap_ms_per_step", 1e3 * t_mm_dec / steps}});
  std::printf(
      "decode workload, %s (%d steps x 8 layers, %zu of %zu pages read per layer): ssd %.1f ms/step, mmap %.1f ms/step: "
      "ssd %.1fx faster\n",
      miss_rate == 1.0 ? "no cache: every selected page (6.25%)" : "the misses a Lookahead W=3 cache leaves", steps, misses, per_layer,
      1e3 * t_ssd_dec / steps, 1e3 * t_mm_dec / steps, t_mm_dec / t_ssd_dec);
}

/// Sequential bandwidth: MmapTier's cold whole-layer loads against O_DIRECT 1 MiB reads.
void sequential_report(const Options& o, const std::string& path, IoEngine& raw, MmapTier& mm, nlohmann::json& result) {
  const double layer_mb = static_cast<double>(o.pages / 8 * kPage) / 1e6;
  const int seq_fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  KVD_EXPECT(seq_fd >= 0, "bench_tier: cannot reopen {}", path);
  const std::size_t chunk = 1 << 20, total = o.pages * kPage;
  const AlignedPages big(8 * chunk / kPage);
  std::vector<IoRead> seq;
  auto t0 = std::chrono::steady_clock::now();
  for (std::size_t off = 0; off < total; off += 8 * chunk) {
    seq.clear();
    for (std::size_t k = 0; k < 8 && off + k * chunk < total; ++k)
      seq.push_back({4096 + off + k * chunk, std::min(chunk, total - off - k * chunk), big[0] + k * chunk, 0});
    raw.read_all(seq_fd, seq);
  }
  const double t_seq = seconds_since(t0);
  ::close(seq_fd);
  mm.drop_cache();
  std::vector<std::byte> one(kPage);
  t0 = std::chrono::steady_clock::now();
  for (std::uint32_t layer = 0; layer < 8; ++layer) {
    const ReadRequest r{{1, layer, 0, 0}, one.data()};
    mm.wait(mm.submit(std::span<const ReadRequest>(&r, 1)));
  }
  const double t_mm_seq = seconds_since(t0);
  result["sequential_mb_per_s"] = {{"raw_1mib", static_cast<double>(total) / 1e6 / t_seq}, {"mmap_layers", 8 * layer_mb / t_mm_seq}};
  std::printf("sequential: O_DIRECT 1 MiB reads %.0f MB/s; mmap whole-layer loads (cold) %.0f MB/s = %.2f of the device\n",
              static_cast<double>(total) / 1e6 / t_seq, 8 * layer_mb / t_mm_seq,
              (8 * layer_mb / t_mm_seq) / (static_cast<double>(total) / 1e6 / t_seq));
}

/// A decode workload against the FlexGen-style strawman: the store's 8 streams are 8 layers;
/// each step reads a random 6.25% of every layer's pages (its misses). MmapTier loads each
/// layer whole; its page cache is dropped before every step, as when the KV outgrows DRAM.
void mmap_reports(const Options& o, const std::string& path, const std::vector<PageKey>& keys, SsdTier& ssd, IoEngine& raw, nlohmann::json& result) {
  const std::string mpath = (std::filesystem::path(o.dir) / "kvd_bench_tier.mmap").string();
  {
    MmapTier mm(MmapTier::Params{mpath, o.pages});
    mm.open({kPage});
    fill_mmap(keys, ssd, mm);
    // Misses per layer-step: all selected pages (no cache), or what a Lookahead W = 3 cache
    // leaves (12.3%: its measured miss rate on the default trace, docs/eviction.md).
    for (const double miss_rate : {1.0, 0.123}) decode_workload(o, miss_rate, ssd, mm, result);
    sequential_report(o, path, raw, mm, result);
  }
  std::filesystem::remove(mpath);
}

/// The SSD reports on a store of --pages pages written to `path`: random reads, then the decode
/// workload and sequential bandwidth against MmapTier. The readers close before it returns.
void ssd_reports(const Options& o, const std::string& path, nlohmann::json& result) {
  const std::vector<PageKey> keys = write_store(o, path);
  // Readers of the store just written: read-only opens share its lock (a writer would be alone).
  SsdTier ssd = make_ssd(path, o.qd, SsdOpen::read_only), ssd1 = make_ssd(path, 1, SsdOpen::read_only),
          ssd_reg = make_ssd(path, o.qd, SsdOpen::read_only);
  ssd.open({kPage});
  ssd_reg.open({kPage});
  std::printf("bench_tier: %zu pages of 4 KiB in %s (%s, %s), batches of %zu pages, queue depth %u\n", o.pages, path.c_str(),
              std::string(ssd.io_name()).c_str(), ssd.direct_io() ? "O_DIRECT" : "buffered: O_DIRECT refused", o.batch, o.qd);
  IoEngine raw;
  raw.open(IoBackend::automatic, o.qd, 0);
  {
    RandomReads reads(o, path, keys, ssd, ssd1, ssd_reg, raw);
    reads.run();
    result = reads.report();
  }
  mmap_reports(o, path, keys, ssd, raw, result);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, o)) return 2;
  try {
    KVD_EXPECT(o.pages >= 64 && o.batch >= 1 && o.qd >= 1 && o.rounds >= 1 && o.remote_pages >= 1, "bench_tier: bad options");
    nlohmann::json result;
    if (o.skip_ssd) {
      remote_report(o, result);
      if (!o.json.empty()) std::ofstream(o.json) << result.dump(2) << "\n";
      return 0;
    }
    KVD_EXPECT(o.pack_layers >= 1 && o.pack_layers <= 8 && o.pack_context >= 1024 && o.pack_steps >= 1,
               "bench_tier: --pack-layers 1..8, --pack-context >= 1024, --pack-steps >= 1");
    const std::string path = (std::filesystem::path(o.dir) / "kvd_bench_tier.store").string();
    SsdTier::remove_files(path);
    ssd_reports(o, path, result);
    SsdTier::remove_files(path);
    remote_report(o, result);
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      f << result.dump(2) << "\n";
      KVD_EXPECT(f.good(), "bench_tier: cannot write {}", o.json);
    }
    packing_report(o, index::HierarchicalParams{}, "hierarchical (KVDrive)");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tier: %s\n", e.what());
    return 1;
  }
  return 0;
}
