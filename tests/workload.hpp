// A random decode workload for the manager tests: sequences of mixed prompt lengths with seeded
// K, V and queries, prefilled and decoded step by step through any KvManager, so that two
// managers that must agree can be driven alike and their outputs compared bit for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "support.hpp"

namespace kvdrive::test {

/// A random workload: `batch` sequences of mixed prompt lengths, decoded for `steps` steps.
struct Workload {
  Config cfg;
  std::vector<int> prompt;
  int steps = 8;
  std::uint64_t seed = 1;

  std::vector<float> rows(int s, int l, int t0, int n, int heads, int salt) const {
    return random_floats(static_cast<std::size_t>(n) * heads * cfg.shape.head_dim,
                         seed * 1000003 + static_cast<std::uint64_t>(s) * 7919 + static_cast<std::uint64_t>(l) * 104729 +
                             static_cast<std::uint64_t>(t0) * 31 + static_cast<std::uint64_t>(salt));
  }
};

template <class M>
std::vector<SeqId> prefill(M& kv, const Workload& w) {
  const auto& sh = w.cfg.shape;
  std::vector<SeqId> ids;
  for (int s = 0; s < static_cast<int>(w.prompt.size()); ++s) {
    ids.push_back(kv.add_sequence());
    for (int l = 0; l < sh.layers; ++l) {
      const auto k = w.rows(s, l, 0, w.prompt[s], sh.kv_heads, 1), v = w.rows(s, l, 0, w.prompt[s], sh.kv_heads, 2);
      kv.prefill(ids.back(), l, make_view(k, w.prompt[s], sh.kv_heads, sh.head_dim), make_view(v, w.prompt[s], sh.kv_heads, sh.head_dim));
    }
  }
  return ids;
}

/// One attend() of layer l at decode step `step` for the whole batch.
template <class M>
std::vector<float> step(M& kv, const Workload& w, const std::vector<SeqId>& ids, int l, int step) {
  const auto& sh = w.cfg.shape;
  const int b = static_cast<int>(ids.size()), d = sh.head_dim;
  std::vector<float> q, k, v;
  for (int s = 0; s < b; ++s) {
    const int t = w.prompt[s] + step;
    const auto qs = w.rows(s, l, t, 1, sh.q_heads, 3), ks = w.rows(s, l, t, 1, sh.kv_heads, 1), vs = w.rows(s, l, t, 1, sh.kv_heads, 2);
    q.insert(q.end(), qs.begin(), qs.end());
    k.insert(k.end(), ks.begin(), ks.end());
    v.insert(v.end(), vs.begin(), vs.end());
  }
  std::vector<float> out(q.size());
  kv.attend(l, ids, make_view(q, b, sh.q_heads, d), make_view(k, b, sh.kv_heads, d), make_view(v, b, sh.kv_heads, d),
            make_view(out, b, sh.q_heads, d));
  return out;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline Workload random_workload(std::mt19937_64& rng) {
  Workload w;
  w.cfg.shape = {2, 8, 4, 32};
  w.cfg.page_tokens = 8;
  w.cfg.sink_tokens = 4;
  w.cfg.local_tokens = 16;
  w.cfg.dtype = rng() % 2 ? DType::f16 : DType::f32;
  w.cfg.budget = Budget::fraction(0.125 + 0.125 * static_cast<double>(rng() % 3));
  const int batch = 1 + static_cast<int>(rng() % 5);
  for (int s = 0; s < batch; ++s) w.prompt.push_back(20 + static_cast<int>(rng() % 300));
  w.steps = 6 + static_cast<int>(rng() % 6);
  w.seed = rng();
  return w;
}

}  // namespace kvdrive::test
