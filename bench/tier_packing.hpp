// bench_tier's packing report: semantic packing (Config::pack_by_cluster, pages of a cluster side
// by side in the store) against the naive layout (pages in seal order), on the miss stream a
// Lookahead W=3 cache leaves, every miss an O_DIRECT read of its own SsdTier store.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvdrive/eval/synthetic.hpp"
#include "kvdrive/kvdrive.hpp"
#include "tier_common.hpp"

namespace kvdrive::bench_tier {

using PackingTiers = Tiers<HostTier, SsdTier>;
using PackingManager = KvManager<index::Hierarchical, eviction::Lookahead, PackingTiers>;

/// The two managers of the packing report and their sequences: [0] packed, [1] naive.
struct PackingPair {
  PackingManager* kv[2];
  SeqId id[2];
};

/// One of the packing report's SsdTier stores, in --dir, removed when its tier closes.
inline SsdTier::Params packing_store(const Options& o, const char* name) {
  SsdTier::Params p;
  p.path = (std::filesystem::path(o.dir) / fmt::format("kvd_bench_pack_{}.store", name)).string();
  p.queue_depth = o.qd;
  p.mode = tier::SsdOpen::recreate;
  p.delete_on_close = true;
  return p;
}

/// Prefills both managers with the streams' prompts (n tokens; stream l * kv_heads + h is layer
/// l's KV head h), layer by layer, each layer warmed up on its observed queries.
inline void prefill_pair(const std::vector<eval::StreamTrace>& streams, const ModelShape& shape, std::int64_t n, const PackingPair& pair) {
  const int kvh = shape.kv_heads, qh = shape.q_heads, d = shape.head_dim, g = qh / kvh;
  const std::int64_t obs = streams[0].observed;
  std::vector<float> k, v, q;
  for (int l = 0; l < shape.layers; ++l) {
    k.assign(static_cast<std::size_t>(n) * kvh * d, 0.0f);
    v.assign(k.size(), 0.0f);
    q.assign(static_cast<std::size_t>(obs) * qh * d, 0.0f);
    for (int h = 0; h < kvh; ++h) {
      const eval::StreamTrace& st = streams[static_cast<std::size_t>(l * kvh + h)];
      for (std::int64_t t = 0; t < n; ++t) {
        std::copy_n(st.key(t), d, k.data() + (static_cast<std::size_t>(t) * kvh + h) * d);
        std::copy_n(st.value(t), d, v.data() + (static_cast<std::size_t>(t) * kvh + h) * d);
      }
      for (std::int64_t i = 0; i < obs; ++i)
        std::copy_n(st.observed_queries.data() + static_cast<std::size_t>(i) * g * d, static_cast<std::size_t>(g) * d,
                    q.data() + (static_cast<std::size_t>(i) * qh + static_cast<std::size_t>(h) * g) * d);
    }
    for (int which = 0; which < 2; ++which) {
      pair.kv[which]->prefill(pair.id[which], l, make_view(k, n, kvh, d), make_view(v, n, kvh, d));
      pair.kv[which]->warm_up(pair.id[which], l, make_view(q, obs, qh, d));
    }
  }
}

/// Decodes `steps` steps of every layer through both managers in turns (so the disk's state is
/// shared); returns each one's fetch seconds.
inline std::array<double, 2> decode_pair(const std::vector<eval::StreamTrace>& streams, const ModelShape& shape, std::int64_t n, std::int64_t steps,
                                         const PackingPair& pair) {
  const int kvh = shape.kv_heads, qh = shape.q_heads, d = shape.head_dim, g = qh / kvh;
  std::array<double, 2> fetch = {0, 0};
  std::vector<float> qs(static_cast<std::size_t>(qh) * d), ks(static_cast<std::size_t>(kvh) * d), vs(ks.size()), out(qs.size());
  for (std::int64_t s = 0; s < steps; ++s)
    for (int l = 0; l < shape.layers; ++l) {
      for (int h = 0; h < kvh; ++h) {
        const eval::StreamTrace& st = streams[static_cast<std::size_t>(l * kvh + h)];
        std::copy_n(st.query(s), static_cast<std::size_t>(g) * d, qs.data() + static_cast<std::size_t>(h) * g * d);
        std::copy_n(st.key(n + s), d, ks.data() + static_cast<std::size_t>(h) * d);
        std::copy_n(st.value(n + s), d, vs.data() + static_cast<std::size_t>(h) * d);
      }
      for (int which = 0; which < 2; ++which) {
        PackingManager& kv = *pair.kv[which];
        const SeqId batch[] = {pair.id[which]};
        kv.attend(l, batch, make_view(qs, 1, qh, d), make_view(ks, 1, kvh, d), make_view(vs, 1, kvh, d), make_view(out, 1, qh, d));
        fetch[which] += kv.last_stats().time.fetch_ms / 1e3;
      }
    }
  return fetch;
}

/// What each manager read from its store over the decode: I/Os, bytes, and fetch seconds.
struct PackingReads {
  std::uint64_t ops[2], bytes[2];
  std::array<double, 2> fetch;
};

/// The packing report's lines: the run, then each layout's I/Os, pages per I/O and fetch rate.
inline void print_packing(const char* clustering, const Options& o, const Config& c, const PackingPair& pair, const PackingReads& r) {
  const Stats& ps = pair.kv[0]->total_stats();
  const Stats& ns = pair.kv[1]->total_stats();
  std::printf(
      "packing, %s (synthetic default, %d layers x %d KV heads, %lld-token prompt, %lld steps, 6.25%%, Lookahead W=3, "
      "warm-up): %llu pages packed; misses %llu (same in both: %s), hit rate %.1f%%\n",
      clustering, c.shape.layers, c.shape.kv_heads, static_cast<long long>(o.pack_context), static_cast<long long>(o.pack_steps),
      static_cast<unsigned long long>(ps.packed), static_cast<unsigned long long>(ps.misses), ps.misses == ns.misses ? "yes" : "NO",
      100 * ps.hit_rate());
  const char* names[2] = {"packed", "naive"};
  for (int i = 0; i < 2; ++i)
    std::printf("  %-6s: %llu I/Os for %llu pages (%.2f pages per I/O), fetch %.1f ms, %.0f MB/s\n", names[i],
                static_cast<unsigned long long>(r.ops[i]), static_cast<unsigned long long>(r.bytes[i] / c.page_bytes()),
                static_cast<double>(r.bytes[i] / c.page_bytes()) / static_cast<double>(std::max<std::uint64_t>(1, r.ops[i])), 1e3 * r.fetch[i],
                static_cast<double>(r.bytes[i]) / 1e6 / std::max(1e-9, r.fetch[i]));
  std::printf("  packed / naive: I/Os %.2f, fetch time %.2f\n",
              static_cast<double>(r.ops[0]) / static_cast<double>(std::max<std::uint64_t>(1, r.ops[1])), r.fetch[0] / std::max(1e-9, r.fetch[1]));
}

/// Semantic packing against the naive layout (pages in seal order), on the miss stream a
/// Lookahead W=3 cache leaves: two KvManagers over their own SsdTier stores, the same synthetic
/// trace (preset `default`, its first `layers` layers), the Hierarchical index at a 6.25%
/// budget, warm-up after prefill. They decode step by step in turns, so the disk's state is
/// shared; every miss is an O_DIRECT read. Reports I/Os, pages per I/O and fetch throughput.
inline void packing_report(const Options& o, const index::HierarchicalParams& params, const char* clustering) {
  const eval::SyntheticPreset preset = eval::synthetic_preset("default");
  const int layers = o.pack_layers, kvh = preset.shape.kv_heads, qh = preset.shape.q_heads, d = preset.shape.head_dim;
  const eval::SyntheticTrace trace(preset, 1, o.pack_context, o.pack_steps);
  Config c;
  c.shape = {layers, qh, kvh, d};
  c.budget = Budget::fraction(0.0625);
  const SsdTier::Params packed_store = packing_store(o, "packed"), naive_store = packing_store(o, "naive");
  Config naive_config = c;
  naive_config.pack_by_cluster = false;
  PackingManager packed(c, index::Hierarchical(params), eviction::Lookahead{3}, PackingTiers(HostTier{}, SsdTier(packed_store)));
  PackingManager naive(naive_config, index::Hierarchical(params), eviction::Lookahead{3}, PackingTiers(HostTier{}, SsdTier(naive_store)));
  const PackingPair pair{{&packed, &naive}, {packed.add_sequence(), naive.add_sequence()}};
  std::vector<eval::StreamTrace> streams;
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < kvh; ++h) streams.push_back(trace.stream(l, h));
  prefill_pair(streams, c.shape, o.pack_context, pair);
  const std::uint64_t ops0[2] = {packed.tiers().get<1>().read_ops(), naive.tiers().get<1>().read_ops()};
  const std::uint64_t bytes0[2] = {packed.total_stats().bytes_read[1], naive.total_stats().bytes_read[1]};
  PackingReads r;
  r.fetch = decode_pair(streams, c.shape, o.pack_context, o.pack_steps, pair);
  for (int i = 0; i < 2; ++i) {
    r.ops[i] = pair.kv[i]->tiers().get<1>().read_ops() - ops0[i];
    r.bytes[i] = pair.kv[i]->total_stats().bytes_read[1] - bytes0[i];
  }
  print_packing(clustering, o, c, pair, r);
  packed.release(pair.id[0]);
  naive.release(pair.id[1]);
}

}  // namespace kvdrive::bench_tier
