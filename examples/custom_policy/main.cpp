// kvd-custom-policy: writing your own policies (docs/policies.md). Two policies defined outside
// the library, custom::FirstKey (an index) and custom::Fifo (an eviction policy), are
//   1. composed into a KvManager over DRAM + an SSD store and decoded, with the output checked
//      against the same manager with eviction::Lookahead (the eviction policy may change what
//      is read, never what is attended: Decision 2);
//   2. compared with the built-in indices through the evaluation API (eval::evaluate_stream:
//      attention-mass recall, output error, index bytes, selection time);
//   3. compared with the built-in eviction policies by replaying the hierarchical index's
//      selections (eval::replay_cache: hit rate at the same cache size).
// Every figure comes from the synthetic trace `default` (docs/synthetic-traces.md).
//
//   kvd-custom-policy [--context N] [--steps N] [--streams N]
#include <kvdrive/eval/synthetic.hpp>
#include <kvdrive/research.hpp>
#include <kvdrive/tier/ssd.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fifo_eviction.hpp"
#include "first_key_index.hpp"

using namespace kvdrive;

namespace {

struct Options {
  std::int64_t context = 8192;
  int steps = 32;
  int streams = 4;
};

/// Part 1: decode one layer of `batch` sequences through KvManager<FirstKey, Eviction> over DRAM
/// + SSD; returns every step's outputs and prints the cache's statistics.
template <class Eviction>
std::vector<float> decode(const eval::SyntheticPreset& preset, const Options& o, const std::string& store) {
  const int kvh = preset.shape.kv_heads, qh = preset.shape.q_heads, d = preset.shape.head_dim;
  Config cfg;
  cfg.shape = {1, qh, kvh, d};
  cfg.budget = Budget::fraction(0.0625);
  using Ssd = Tiers<tier::HostTier, tier::SsdTier>;
  tier::SsdTier::Params sp;
  sp.path = store;
  sp.mode = tier::SsdOpen::recreate;  // a fresh store (under its lock; never over a file that is not one)
  std::vector<float> all;
  {
    KvManager<custom::FirstKey, Eviction, Ssd> kv(cfg, {}, Eviction{3}, Ssd(tier::HostTier{}, tier::SsdTier(sp)));
    const eval::SyntheticTrace trace(preset, 1, o.context, o.steps);
    const eval::LayerInputs in = eval::layer_inputs(trace, 0);
    const SeqId id = kv.add_sequence();
    kv.prefill(id, 0, in.prompt_k(), in.prompt_v());
    kv.warm_up(id, 0, in.observation_queries());
    std::vector<float> q, k, v, out(static_cast<std::size_t>(qh) * d);
    const SeqId batch[] = {id};
    for (int s = 0; s < o.steps; ++s) {
      eval::batch_step(std::span<const eval::LayerInputs>(&in, 1), s, q, k, v);
      kv.attend(0, batch, make_view(q, 1, qh, d), make_view(k, 1, kvh, d), make_view(v, 1, kvh, d), make_view(out, 1, qh, d));
      all.insert(all.end(), out.begin(), out.end());
    }
    const Stats& st = kv.total_stats();
    std::printf("  %-10s hit rate %5.1f%%, %6.1f pages read from the SSD per step, %llu evictions\n", std::string(Eviction::name()).c_str(),
                100 * st.hit_rate(), static_cast<double>(st.misses) / static_cast<double>(st.steps), static_cast<unsigned long long>(st.evictions));
    kv.release(id);
  }  // the manager and its store closed: the store's lock is free
  tier::SsdTier::remove_files(store);
  return all;
}

/// Part 1: the same decode under custom::Fifo and eviction::Lookahead; returns whether the outputs
/// are bitwise equal.
bool compare_outputs(const eval::SyntheticPreset& preset, const Options& o) {
  const auto dir = std::filesystem::temp_directory_path();
  std::printf(
      "1. KvManager<custom::FirstKey, custom::Fifo> over DRAM + SSD: one layer of the synthetic trace `default`, %lld "
      "tokens, %d steps, 6.25%% budget, W = 3\n",
      static_cast<long long>(o.context), o.steps);
  const std::vector<float> fifo = decode<custom::Fifo>(preset, o, (dir / "kvd_custom_fifo.store").string());
  const std::vector<float> lookahead = decode<eviction::Lookahead>(preset, o, (dir / "kvd_custom_lookahead.store").string());
  const bool same = fifo.size() == lookahead.size() && std::memcmp(fifo.data(), lookahead.data(), fifo.size() * sizeof(float)) == 0;
  std::printf("  outputs bitwise equal under both eviction policies (Decision 2): %s\n\n", same ? "yes" : "NO");
  return same;
}

/// The hierarchical index's selections on each stream, and each stream's warm-up ranking, for
/// part 3.
struct Selections {
  std::vector<eval::SelectionLog> logs;
  std::vector<tier::PageRanking> warm;
};

/// Part 2: the evaluation API: every index replays the same streams.
Selections compare_indices(const eval::SyntheticPreset& preset, const Options& o) {
  std::vector<std::unique_ptr<eval::AnyIndex>> indices;
  indices.push_back(eval::make_any_index(custom::FirstKey{}));
  indices.push_back(eval::make_any_index(index::MeanKey{}));
  indices.push_back(eval::make_any_index(index::Quest{}));
  indices.push_back(eval::make_any_index(index::Hierarchical{}));
  indices.push_back(eval::make_any_index(index::OracleMass{}));
  const std::size_t hierarchical = 3;
  eval::EvalSettings set;
  const eval::SyntheticTrace trace(preset, 2, o.context, o.steps);
  std::vector<eval::IndexTally> total(indices.size());
  std::vector<eval::SelectionLog> logs;
  Selections sel;
  for (int s = 0; s < o.streams; ++s) {
    const eval::StreamTrace st = trace.stream(s % preset.shape.layers, (s / preset.shape.layers) % preset.shape.kv_heads);
    const std::vector<eval::IndexTally> t = eval::evaluate_stream(st, indices, set, &logs);
    for (std::size_t i = 0; i < t.size(); ++i) {
      total[i].name = t[i].name;
      total[i].add(t[i]);
    }
    sel.logs.push_back(logs[hierarchical]);
    sel.warm.push_back(eval::warm_ranking(st, set, tier::ImportanceGuided{}));
  }
  std::printf("2. Indices on %d streams (eval::evaluate_stream), 6.25%% budget:\n", o.streams);
  std::printf("  %-14s %12s %12s %10s %14s %12s\n", "index", "mass recall", "worst head", "out err", "bytes/token", "select us");
  for (const eval::IndexTally& t : total)
    std::printf("  %-14s %12.3f %12.3f %10.4f %14.2f %12.1f\n", t.name.c_str(), t.mean(t.mass_recall), t.mean(t.mass_recall_min), t.mean(t.out_err),
                t.bytes_per_token(), t.select_us());
  return sel;
}

/// Part 3: eviction policies replaying the hierarchical index's selections, at the same W.
void compare_evictions(const Selections& sel) {
  std::printf("\n3. Eviction policies on the hierarchical index's selections (eval::replay_cache), W = 3, with warm-up:\n");
  const auto replay = [&](const auto& policy) {
    eval::CacheTally t;
    for (std::size_t s = 0; s < sel.logs.size(); ++s) t += eval::replay_cache(policy, sel.logs[s], {.window = 3, .warm_up = true}, &sel.warm[s]);
    std::printf("  %-10s hit rate %5.1f%%, %5.1f pages fetched per step\n", std::string(std::decay_t<decltype(policy)>::name()).c_str(),
                100 * t.hit_rate(), t.fetched_pages_per_step());
    return t.hit_rate();
  };
  replay(custom::Fifo{});
  replay(eviction::Lru{});
  replay(eviction::Lookahead{});
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--context") o.context = std::atoll(argv[i + 1]);
    else if (a == "--steps") o.steps = std::atoi(argv[i + 1]);
    else if (a == "--streams") o.streams = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "kvd-custom-policy: unknown option %s (--context N, --steps N, --streams N)\n", a.c_str());
      return 2;
    }
  }
  try {
    KVD_EXPECT(o.context >= 1024 && o.steps >= 1 && o.streams >= 1 && o.streams <= 64,
               "kvd-custom-policy: --context >= 1024, --steps >= 1, --streams 1..64");
    const eval::SyntheticPreset preset = eval::synthetic_preset("default");
    const bool same = compare_outputs(preset, o);
    compare_evictions(compare_indices(preset, o));
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvd-custom-policy: %s\n", e.what());
    return 1;
  }
}
