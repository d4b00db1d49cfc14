// Seeded synthetic Q/K/V traces with the structure real long-context attention shows, so that
// indices and caches can be evaluated at 32K-128K+ tokens without a large model (DESIGN,
// "Evaluation"). Each stream (layer, KV head) is made independently and deterministically from
// (seed, layer, kv_head): pre-RoPE keys and queries built from attention sinks, topic runs,
// slowly drifting queries, needles for retrieval heads, a positional vector shared by q and k
// (a local band in every head, dominant in local heads) and outlier key channels, then rotated
// with real RoPE (rotate-half, theta 500000). Presets are named parameter sets; `default` is
// calibrated to published figures and frozen.
// docs/synthetic-traces.md says what is modelled, how, and what `default` measures.
//
// The parts: synthetic_preset.hpp (the parameters and the named presets), synthetic_random.hpp
// (the generator and seed mixing), synthetic_stream.hpp (how one stream is made), rope.hpp
// (RoPE); here SyntheticTrace, with what every stream of a trace shares: the topic runs of the
// text, the needles' positions and each head's role.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvdrive/core/config.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/eval/rope.hpp"
#include "kvdrive/eval/stream_trace.hpp"
#include "kvdrive/eval/synthetic_preset.hpp"
#include "kvdrive/eval/synthetic_random.hpp"
#include "kvdrive/eval/synthetic_stream.hpp"

namespace kvdrive::eval {

/// A synthetic trace: `context` prompt tokens, then `steps` decode steps (StreamTrace.prefix =
/// context). Cheap to construct (the shared topic runs and needle positions only); stream()
/// makes one stream on demand, from (seed, layer, kv_head) alone, so streams may be made in any
/// order or in parallel. Keys of positions < context do not depend on `steps`, and a longer
/// run's first steps equal a shorter one's.
class SyntheticTrace {
 public:
  /// Prompt queries made for warm-up placement (the last ones before decode; SnapKV uses 16-64).
  static constexpr std::int64_t kObservedQueries = 64;

  SyntheticTrace(SyntheticPreset preset, std::uint64_t seed, std::int64_t context, std::int64_t steps)
      : preset_(std::move(preset)), seed_(seed), context_(context), steps_(steps) {
    preset_.validate();
    KVD_EXPECT(context >= 1, "SyntheticTrace: context {} tokens, expected >= 1", context);
    KVD_EXPECT(steps >= 1, "SyntheticTrace: steps {}, expected >= 1", steps);
    KVD_EXPECT(context + steps <= (std::int64_t{1} << 31), "SyntheticTrace: {} + {} tokens, expected at most 2^31", context, steps);
    make_topic_runs();
    make_needles();
    make_head_kinds();
  }

  const ModelShape& shape() const { return preset_.shape; }
  const SyntheticPreset& preset() const { return preset_; }
  std::uint64_t seed() const { return seed_; }
  std::int64_t context() const { return context_; }
  std::int64_t steps() const { return steps_; }

  /// What the KV head (layer, kv_head) does; fixed by the preset, not the seed (a model's heads
  /// keep their roles whatever the prompt).
  HeadKind head_kind(int layer, int kv_head) const {
    check_stream(layer, kv_head);
    return kinds_[static_cast<std::size_t>(layer) * preset_.shape.kv_heads + kv_head];
  }
  /// First position of each needle (needle_tokens tokens each); empty if the context is too short.
  const std::vector<std::int64_t>& needle_positions() const { return needles_; }
  /// The topic of the token at a position.
  int topic(std::int64_t position) const {
    KVD_EXPECT(position >= 0 && position < tokens(), "SyntheticTrace: position {} out of range [0, {})", position, tokens());
    return topic_of_[static_cast<std::size_t>(position)];
  }

  /// One stream, keys and queries after RoPE.
  StreamTrace stream(int layer, int kv_head) const { return make(layer, kv_head, true); }
  /// The same stream before RoPE: for tests, and for indices that work on pre-RoPE keys
  /// (ShadowKV keeps pre-RoPE keys low-rank).
  StreamTrace stream_before_rope(int layer, int kv_head) const { return make(layer, kv_head, false); }

 private:
  using Rng = synthetic_detail::Rng;

  void check_stream(int layer, int kv_head) const {
    KVD_EXPECT(layer >= 0 && layer < preset_.shape.layers, "SyntheticTrace: layer {} out of range [0, {})", layer, preset_.shape.layers);
    KVD_EXPECT(kv_head >= 0 && kv_head < preset_.shape.kv_heads, "SyntheticTrace: kv_head {} out of range [0, {})", kv_head, preset_.shape.kv_heads);
  }

  std::int64_t tokens() const { return context_ + steps_; }

  // Contiguous runs, each on a topic other than the previous run's; lengths are the minimum
  // plus a geometric tail, so text stays on a topic for a while.
  void make_topic_runs() {
    Rng rng(synthetic_detail::mix(seed_, 0x70701c5ull));
    topic_of_.resize(static_cast<std::size_t>(tokens()));
    const double p = 1.0 / (preset_.topic_run_mean - preset_.topic_run_min + 1.0);
    int current = static_cast<int>(rng.below(static_cast<std::uint64_t>(preset_.topics)));
    for (std::int64_t t = 0; t < tokens();) {
      const double u = 1.0 - rng.uniform();  // (0, 1]
      const auto extra = p >= 1.0 ? 0.0 : std::floor(std::log(u) / std::log1p(-p));
      const std::int64_t len = preset_.topic_run_min + static_cast<std::int64_t>(std::min(extra, 1e9));
      for (std::int64_t e = std::min(tokens(), t + len); t < e; ++t) topic_of_[static_cast<std::size_t>(t)] = static_cast<std::uint16_t>(current);
      if (preset_.topics > 1) {
        const int next = static_cast<int>(rng.below(static_cast<std::uint64_t>(preset_.topics - 1)));
        current = next >= current ? next + 1 : next;
      }
    }
  }

  void make_needles() {
    Rng rng(synthetic_detail::mix(seed_, 0x9eed1e5ull));
    const std::int64_t first = preset_.sink_tokens, last = context_ - preset_.needle_tokens;  // whole needle in the prompt
    if (last < first) return;
    for (int j = 0; j < preset_.needles; ++j) {
      const double depth = preset_.needle_depth_min + (preset_.needle_depth_max - preset_.needle_depth_min) * rng.uniform();
      needles_.push_back(std::clamp(static_cast<std::int64_t>(depth * static_cast<double>(context_)), first, last));
    }
  }

  // Largest-remainder counts per kind, spread over the layer's heads by a fixed shuffle.
  void make_head_kinds() {
    const int h = preset_.shape.kv_heads;
    kinds_.assign(static_cast<std::size_t>(preset_.shape.layers) * h, HeadKind::semantic);
    for (int l = 0; l < preset_.shape.layers; ++l) {
      const SyntheticLayer& y = preset_.layers[static_cast<std::size_t>(l)];
      const int n_ret = static_cast<int>(std::lround(y.retrieval * h));
      const int n_loc = std::min(h - n_ret, static_cast<int>(std::lround(y.local * h)));
      std::vector<int> order(static_cast<std::size_t>(h));
      for (int i = 0; i < h; ++i) order[static_cast<std::size_t>(i)] = i;
      Rng rng(synthetic_detail::mix(0x4eadc1a55ull, static_cast<std::uint64_t>(l)));
      for (int i = h - 1; i > 0; --i) std::swap(order[static_cast<std::size_t>(i)], order[rng.below(static_cast<std::uint64_t>(i) + 1)]);
      for (int i = 0; i < n_ret; ++i) kinds_[static_cast<std::size_t>(l) * h + order[static_cast<std::size_t>(i)]] = HeadKind::retrieval;
      for (int i = n_ret; i < n_ret + n_loc; ++i) kinds_[static_cast<std::size_t>(l) * h + order[static_cast<std::size_t>(i)]] = HeadKind::local;
    }
  }

  std::uint64_t stream_seed(int layer, int kv_head) const {
    return synthetic_detail::mix(seed_, 0x57ea111ull, static_cast<std::uint64_t>(layer), static_cast<std::uint64_t>(kv_head));
  }

  /// A stream's shape and sizes, its arrays zeroed, ready for the passes to fill.
  StreamTrace empty_stream(int layer, int kv_head) const {
    const auto Ds = static_cast<std::size_t>(preset_.shape.head_dim);
    StreamTrace s;
    s.layer = layer;
    s.kv_head = kv_head;
    s.head_dim = preset_.shape.head_dim;
    s.group = preset_.shape.group();
    s.prefix = context_;
    s.steps = steps_;
    s.keys.assign(static_cast<std::size_t>(tokens()) * Ds, 0.0f);
    s.values.assign(s.keys.size(), 0.0f);
    s.queries.assign(static_cast<std::size_t>(steps_) * static_cast<std::size_t>(s.group) * Ds, 0.0f);
    s.observed = std::min<std::int64_t>(kObservedQueries, context_);
    return s;
  }

  /// Applies RoPE to the keys (positions from 0), the decode queries (from context) and the
  /// observed queries (the prompt's last positions).
  void rotate(StreamTrace& s) const {
    const int D = s.head_dim, G = s.group;
    const double theta = preset_.rope_theta;
    const std::size_t stride = static_cast<std::size_t>(G) * static_cast<std::size_t>(D);
    rope_rotate_rows(s.keys.data(), s.tokens(), D, 0, theta);
    for (int g = 0; g < G; ++g) rope_rotate_rows(s.queries.data() + static_cast<std::size_t>(g) * D, steps_, D, context_, theta, stride);
    for (int g = 0; g < G; ++g)
      rope_rotate_rows(s.observed_queries.data() + static_cast<std::size_t>(g) * D, s.observed, D, context_ - s.observed, theta, stride);
  }

  /// One stream: its directions, keys and values, queries (synthetic_stream.hpp), each pass from
  /// its own random stream; RoPE last, when `rotate_rope`.
  StreamTrace make(int layer, int kv_head, bool rotate_rope) const {
    check_stream(layer, kv_head);
    const HeadKind kind = kinds_[static_cast<std::size_t>(layer) * preset_.shape.kv_heads + kv_head];
    const synthetic_detail::StreamRole role{
        preset_,
        preset_.layers[static_cast<std::size_t>(layer)],
        1.0 / std::sqrt(static_cast<double>(preset_.shape.head_dim)),
        kind == HeadKind::local,
        kind == HeadKind::retrieval && !needles_.empty(),
        preset_.needles > 0 ? (layer * preset_.shape.kv_heads + kv_head) % preset_.needles : -1,
    };
    const std::uint64_t seed = stream_seed(layer, kv_head);
    Rng dir(synthetic_detail::mix(seed, 1)), kv(synthetic_detail::mix(seed, 2)), qr(synthetic_detail::mix(seed, 3)),
        back(synthetic_detail::mix(seed, 4));
    const synthetic_detail::StreamDirections w = synthetic_detail::make_directions(preset_, dir);
    StreamTrace s = empty_stream(layer, kv_head);
    synthetic_detail::make_keys_values(role, w, topic_of_, needles_, kv, s);
    synthetic_detail::QueryProcess process(role, w, qr);
    synthetic_detail::make_queries(process, qr, s);
    synthetic_detail::make_observed_queries(process, back, s);
    if (rotate_rope) rotate(s);
    return s;
  }

  SyntheticPreset preset_;
  std::uint64_t seed_;
  std::int64_t context_, steps_;
  std::vector<std::uint16_t> topic_of_;  ///< topic of every position, shared by all streams
  std::vector<std::int64_t> needles_;
  std::vector<HeadKind> kinds_;
};

}  // namespace kvdrive::eval
