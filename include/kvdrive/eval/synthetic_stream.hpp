// One stream (layer, KV head) of a synthetic trace, as SyntheticTrace::stream makes it
// (eval/synthetic.hpp). Three passes, each drawing from its own random stream seeded from the
// stream's seed, so no pass's draws depend on another's:
//   1. the stream's fixed directions, its "weights" (make_directions);
//   2. the keys and values, token by token (make_keys_values);
//   3. the queries, step by step, then the prompt's last queries run backwards from step 0's
//      state on a fourth stream (QueryProcess, make_queries, make_observed_queries).
// Within a pass the order of the draws is part of the trace: tests compare traces bit for bit,
// so never reorder them. docs/synthetic-traces.md says what each part models.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvdrive/eval/stream_trace.hpp"
#include "kvdrive/eval/synthetic_preset.hpp"
#include "kvdrive/eval/synthetic_random.hpp"

namespace kvdrive::eval::synthetic_detail {

// ---- directions ------------------------------------------------------------------------------

/// A random unit vector over the given dims of a head_dim vector (zero elsewhere).
inline std::vector<double> unit_on(Rng& rng, int head_dim, const std::vector<int>& dims) {
  std::vector<double> v(static_cast<std::size_t>(head_dim), 0.0);
  double n2 = 0;
  for (int j : dims) n2 += (v[static_cast<std::size_t>(j)] = rng.normal()) * v[static_cast<std::size_t>(j)];
  const double inv = 1.0 / std::sqrt(n2);
  for (int j : dims) v[static_cast<std::size_t>(j)] *= inv;
  return v;
}

/// Removes from v its components along the unit vectors in `basis`, then normalises it.
inline void orthonormalize(std::vector<double>& v, const std::vector<std::vector<double>>& basis) {
  for (const auto& b : basis) {
    double d = 0;
    for (std::size_t j = 0; j < v.size(); ++j) d += v[j] * b[j];
    for (std::size_t j = 0; j < v.size(); ++j) v[j] -= d * b[j];
  }
  double n2 = 0;
  for (double x : v) n2 += x * x;
  const double inv = n2 > 0 ? 1.0 / std::sqrt(n2) : 0.0;
  for (double& x : v) x *= inv;
}

/// Dims of RoPE pairs [first, last) of a head_dim vector.
inline std::vector<int> pair_dims(int head_dim, int first, int last) {
  const int half = head_dim / 2;
  std::vector<int> d;
  for (int i = first; i < last; ++i) d.push_back(i);
  for (int i = first; i < last; ++i) d.push_back(i + half);
  return d;
}

/// A stream's fixed directions ("weights") and which dims carry what.
struct StreamDirections {
  std::vector<int> fast;        ///< pairs [0, semantic_first_pair): noise, jitter
  std::vector<int> positional;  ///< the local band's pairs
  std::vector<int> semantic;    ///< topics and content
  std::vector<int> anchor;      ///< sink and needles: the anchor pairs but the outlier channels
  std::vector<int> outliers;    ///< outlier key channels, taken out of the anchor dims
  std::vector<double> outlier_value;
  std::vector<std::vector<double>> topic_dir;  ///< per topic, on the semantic dims
  std::vector<std::vector<double>> anchors;    ///< sink, then one per needle: orthonormal
  std::vector<double> pos_dir;                 ///< the positional vector shared by q and k
  std::vector<float> topic_value;              ///< [topics][head_dim]: each topic's mean value
  std::vector<float> needle_value;             ///< [head_dim]: what a needle token's value adds
};

/// Outlier channels: a few anchor dims, taken out of the sink/needle support, each with a large
/// value of random sign.
inline void pick_outliers(const SyntheticPreset& P, Rng& dir, StreamDirections& w) {
  for (int i = 0; i < P.outlier_channels; ++i) {
    const std::size_t at = dir.below(w.anchor.size());
    w.outliers.push_back(w.anchor[at]);
    w.anchor.erase(w.anchor.begin() + static_cast<std::ptrdiff_t>(at));
    w.outlier_value.push_back(P.outlier_magnitude * (0.75 + 0.5 * dir.uniform()) * (dir.uniform() < 0.5 ? -1.0 : 1.0));
  }
}

/// The stream's directions, drawn from `dir` in this order: outlier channels, topic directions
/// (orthonormal while they fit in the semantic dims, random beyond), the sink and needle anchors
/// (orthonormal), the positional vector, the topic values, the needle value.
inline StreamDirections make_directions(const SyntheticPreset& P, Rng& dir) {
  const int D = P.shape.head_dim, half = D / 2;
  StreamDirections w;
  w.fast = pair_dims(D, 0, P.semantic_first_pair);
  w.positional = pair_dims(D, P.positional_first_pair, P.positional_end_pair);
  w.semantic = pair_dims(D, P.semantic_first_pair, P.anchor_first_pair);
  w.anchor = pair_dims(D, P.anchor_first_pair, half);
  pick_outliers(P, dir, w);
  for (int z = 0; z < P.topics; ++z) {
    std::vector<double> u = unit_on(dir, D, w.semantic);
    if (static_cast<std::size_t>(z) < w.semantic.size()) orthonormalize(u, w.topic_dir);
    w.topic_dir.push_back(std::move(u));
  }
  for (int i = 0; i < 1 + P.needles; ++i) {
    std::vector<double> u = unit_on(dir, D, w.anchor);
    orthonormalize(u, w.anchors);
    w.anchors.push_back(std::move(u));
  }
  w.pos_dir = unit_on(dir, D, w.positional);
  const auto Ds = static_cast<std::size_t>(D);
  w.topic_value.resize(static_cast<std::size_t>(P.topics) * Ds);
  w.needle_value.resize(Ds);
  for (auto& x : w.topic_value) x = static_cast<float>(P.value_topic * dir.normal());
  for (auto& x : w.needle_value) x = static_cast<float>(P.value_topic * 2.0 * dir.normal());
  return w;
}

// ---- keys and values -------------------------------------------------------------------------

/// What one stream is, beside its directions: the parameters that apply to it and its head's role.
struct StreamRole {
  const SyntheticPreset& P;
  const SyntheticLayer& L;
  double scale;       ///< 1 / sqrt(head_dim)
  bool is_local;      ///< a local head
  bool is_retrieval;  ///< a retrieval head of a trace with needles
  int needle;         ///< the needle a retrieval head looks for (-1: no needles)
  /// The local band: the same positional vector in q and k, so RoPE makes q.k peak at distance
  /// 0; its logit there is split evenly between q and k.
  double pos_norm() const { return std::sqrt((is_local ? P.local_gain : L.band_gain) / scale); }
};

/// Key k and value v of sink token t: the shared sink direction, scaled so its logit drops by
/// sink_decay per token; small noise elsewhere.
inline void sink_token(const StreamRole& r, const StreamDirections& w, std::int64_t t, Rng& kv, float* k, float* v) {
  const SyntheticPreset& P = r.P;
  const double c = P.key_sink_norm * std::max(0.0, 1.0 - static_cast<double>(t) * P.sink_decay / r.L.sink_gain);
  for (int j : w.anchor) k[j] = static_cast<float>(c * w.anchors[0][static_cast<std::size_t>(j)]);
  for (int j : w.fast) k[j] = static_cast<float>(0.1 * P.key_noise_sd * kv.normal());
  for (int j : w.semantic) k[j] = static_cast<float>(0.1 * P.key_token_sd * kv.normal());
  for (std::size_t j = 0; j < static_cast<std::size_t>(P.shape.head_dim); ++j)
    v[j] = static_cast<float>(P.sink_value_scale * P.value_noise * kv.normal());
}

/// Key k and value v of text token t on topic z: the topic direction plus token content, the
/// positional vector, noise; the needles' anchors and value where t is part of one.
inline void text_token(const StreamRole& r, const StreamDirections& w, std::int64_t t, std::size_t z, const std::vector<std::int64_t>& needles,
                       double pos_norm, Rng& kv, float* k, float* v) {
  const SyntheticPreset& P = r.P;
  const auto Ds = static_cast<std::size_t>(P.shape.head_dim);
  const std::vector<double>& u = w.topic_dir[z];
  for (int j : w.semantic) k[j] = static_cast<float>(P.key_topic_norm * u[static_cast<std::size_t>(j)] + P.key_token_sd * kv.normal());
  for (int j : w.fast) k[j] = static_cast<float>(P.key_noise_sd * kv.normal() + pos_norm * w.pos_dir[static_cast<std::size_t>(j)]);
  for (int j : w.anchor) k[j] = static_cast<float>(0.1 * P.key_noise_sd * kv.normal());
  const float* tv = w.topic_value.data() + z * Ds;
  for (std::size_t j = 0; j < Ds; ++j) v[j] = tv[j] + static_cast<float>(P.value_noise * kv.normal());
  for (std::size_t n = 0; n < needles.size(); ++n)
    if (t >= needles[n] && t < needles[n] + P.needle_tokens) {
      for (int j : w.anchor) k[j] += static_cast<float>(P.key_sink_norm * w.anchors[1 + n][static_cast<std::size_t>(j)]);
      for (std::size_t j = 0; j < Ds; ++j) v[j] += w.needle_value[j];
    }
}

/// Every key and value of s (already sized), token by token from `kv`; topic_of[t] is token t's
/// topic and `needles` the needles' first positions.
inline void make_keys_values(const StreamRole& r, const StreamDirections& w, const std::vector<std::uint16_t>& topic_of,
                             const std::vector<std::int64_t>& needles, Rng& kv, StreamTrace& s) {
  const auto Ds = static_cast<std::size_t>(s.head_dim);
  const double pos_norm = r.pos_norm();
  for (std::int64_t t = 0; t < s.tokens(); ++t) {
    float* k = s.keys.data() + static_cast<std::size_t>(t) * Ds;
    float* v = s.values.data() + static_cast<std::size_t>(t) * Ds;
    if (t < r.P.sink_tokens) sink_token(r, w, t, kv, k, v);
    else text_token(r, w, t, static_cast<std::size_t>(topic_of[static_cast<std::size_t>(t)]), needles, pos_norm, kv, k, v);
    for (std::size_t o = 0; o < w.outliers.size(); ++o) k[w.outliers[o]] = static_cast<float>(w.outlier_value[o] * (1.0 + 0.05 * kv.normal()));
  }
}

// ---- queries ---------------------------------------------------------------------------------

/// The state the group's queries are made from. Topic affinities a[z] ~ N(0, 1) and content
/// directions follow AR(1) processes: the query drifts slowly, so consecutive steps' critical
/// pages overlap. The jitter is new every step. Gains are logits: component norm = gain /
/// (scale x the key's matching norm).
class QueryProcess {
 public:
  /// The initial state, drawn from `qr`: affinities, content directions, sink logits.
  QueryProcess(const StreamRole& r, const StreamDirections& w, Rng& qr) : r_(r), w_(w) {
    const SyntheticPreset& P = r.P;
    const SyntheticLayer& L = r.L;
    const auto Ds = static_cast<std::size_t>(P.shape.head_dim);
    const int G = P.shape.group();
    const double content_share = r.is_local ? P.local_content : 1.0;
    g_topic_ = content_share * L.topic_gain / (r.scale * P.key_topic_norm);
    g_content_ = content_share * L.content_gain / (r.scale * P.key_token_sd);
    g_jitter_ = L.jitter_gain / (r.scale * P.key_noise_sd);
    g_needle_ = P.needle_gain / (r.scale * P.key_sink_norm);
    rho_t_ = 1.0 - L.topic_drift;
    rho_c_ = 1.0 - L.content_drift;
    inn_t_ = std::sqrt(1.0 - rho_t_ * rho_t_);
    inn_c_ = std::sqrt(1.0 - rho_c_ * rho_c_);
    inv_sem_ = 1.0 / std::sqrt(static_cast<double>(w.semantic.size()));
    inv_fast_ = 1.0 / std::sqrt(static_cast<double>(w.fast.size()));
    pos_norm_ = r.pos_norm();
    affinity_.resize(static_cast<std::size_t>(P.topics));
    for (double& a : affinity_) a = qr.normal();
    // content_[0] is the group's shared direction, content_[1 + g] query head g's own; entries
    // N(0, 1/|semantic|), so each has norm ~1.
    content_.assign(static_cast<std::size_t>(G) + 1, std::vector<double>(Ds, 0.0));
    for (auto& c : content_)
      for (int j : w.semantic) c[static_cast<std::size_t>(j)] = qr.normal() * inv_sem_;
    sink_logit_.resize(static_cast<std::size_t>(G));
    for (double& x : sink_logit_) x = L.sink_gain + P.sink_spread * qr.normal();
    share_ = std::sqrt(P.group_coherence);
    own_ = std::sqrt(1.0 - P.group_coherence);
    q_.resize(Ds);
    affinity0_ = affinity_;
    content0_ = content_;
  }

  /// Query head g's query from the current state into out (head_dim floats); the jitter comes
  /// from `rng`.
  void compose(int g, Rng& rng, float* out) {
    const SyntheticPreset& P = r_.P;
    std::fill(q_.begin(), q_.end(), 0.0);
    const double g_sink = sink_logit_[static_cast<std::size_t>(g)] / (r_.scale * P.key_sink_norm);
    for (int j : w_.anchor) q_[static_cast<std::size_t>(j)] += g_sink * w_.anchors[0][static_cast<std::size_t>(j)];
    if (r_.is_retrieval)
      for (int j : w_.anchor)
        q_[static_cast<std::size_t>(j)] += g_needle_ * w_.anchors[1 + static_cast<std::size_t>(r_.needle)][static_cast<std::size_t>(j)];
    for (int z = 0; z < P.topics; ++z) {
      const double wz = g_topic_ * affinity_[static_cast<std::size_t>(z)];
      for (int j : w_.semantic) q_[static_cast<std::size_t>(j)] += wz * w_.topic_dir[static_cast<std::size_t>(z)][static_cast<std::size_t>(j)];
    }
    for (int j : w_.semantic)
      q_[static_cast<std::size_t>(j)] += g_content_ * (share_ * content_[0][static_cast<std::size_t>(j)] +
                                                       own_ * content_[1 + static_cast<std::size_t>(g)][static_cast<std::size_t>(j)]);
    for (int j : w_.fast)
      q_[static_cast<std::size_t>(j)] += g_jitter_ * inv_fast_ * rng.normal() + pos_norm_ * w_.pos_dir[static_cast<std::size_t>(j)];
    for (std::size_t j = 0; j < q_.size(); ++j) out[j] = static_cast<float>(q_[j]);
  }

  /// One step of the AR(1) processes, from `rng`.
  void drift(Rng& rng) {
    for (double& a : affinity_) a = rho_t_ * a + inn_t_ * rng.normal();
    for (auto& c : content_)
      for (int j : w_.semantic) c[static_cast<std::size_t>(j)] = rho_c_ * c[static_cast<std::size_t>(j)] + inn_c_ * rng.normal() * inv_sem_;
  }

  /// Back to the initial state (step 0's).
  void rewind() {
    affinity_ = affinity0_;
    content_ = content0_;
  }

 private:
  const StreamRole& r_;
  const StreamDirections& w_;
  double g_topic_, g_content_, g_jitter_, g_needle_;  ///< gains, as component norms
  double rho_t_, rho_c_, inn_t_, inn_c_;              ///< AR(1) correlation and innovation
  double inv_sem_, inv_fast_, pos_norm_, share_, own_;
  std::vector<double> affinity_, sink_logit_, q_;
  std::vector<std::vector<double>> content_;
  std::vector<double> affinity0_;
  std::vector<std::vector<double>> content0_;
};

/// The decode queries of s (already sized): step by step, drifting before every step but the
/// first, jitter and drift from `qr`.
inline void make_queries(QueryProcess& process, Rng& qr, StreamTrace& s) {
  const auto G = static_cast<std::size_t>(s.group), Ds = static_cast<std::size_t>(s.head_dim);
  for (std::int64_t st = 0; st < s.steps; ++st) {
    if (st > 0) process.drift(qr);
    for (int g = 0; g < s.group; ++g)
      process.compose(g, qr, s.queries.data() + (static_cast<std::size_t>(st) * G + static_cast<std::size_t>(g)) * Ds);
  }
}

/// The prompt's last s.observed queries, for warm-up placement: the same processes run
/// backwards from step 0's state (a stationary AR(1) is time-reversible), on their own random
/// stream `back`, so the decode queries do not depend on them.
inline void make_observed_queries(QueryProcess& process, Rng& back, StreamTrace& s) {
  const auto G = static_cast<std::size_t>(s.group), Ds = static_cast<std::size_t>(s.head_dim);
  s.observed_queries.assign(static_cast<std::size_t>(s.observed) * G * Ds, 0.0f);
  process.rewind();
  for (std::int64_t i = s.observed - 1; i >= 0; --i) {
    process.drift(back);
    for (int g = 0; g < s.group; ++g)
      process.compose(g, back, s.observed_queries.data() + (static_cast<std::size_t>(i) * G + static_cast<std::size_t>(g)) * Ds);
  }
}

}  // namespace kvdrive::eval::synthetic_detail
