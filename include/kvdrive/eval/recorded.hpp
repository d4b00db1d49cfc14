// RecordedTrace: a trace file written by `kvd-llama --record-trace` (eval/trace.hpp) seen as
// streams, like SyntheticTrace: the last `steps` recorded positions of each layer are the decode
// steps, the positions before them the prompt. Positions must be recorded contiguously from 0.
// With `end`, only the positions before it are seen: RecordedTrace(path, 32, prompt_end) makes
// the prompt's last 32 tokens the decode steps, which is what a decoder knows at the end of
// prefill (a knapsack profiled on the request's own prompt: kvd-eval --calibration prompt).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kvdrive/core/config.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/eval/stream_trace.hpp"
#include "kvdrive/eval/trace.hpp"

namespace kvdrive::eval {

class RecordedTrace {
 public:
  /// Prompt queries kept for warm-up placement (the last ones before the decode steps).
  static constexpr std::int64_t kObservedQueries = 64;

  /// steps: decode steps taken from the end of each layer's positions (>= 1, < positions);
  /// end: the positions seen are those before it (-1: all; else 2 .. the recorded positions).
  RecordedTrace(const std::string& path, std::int64_t steps, std::int64_t end = -1) : reader_(path), steps_(steps) {
    const ModelShape& s = reader_.shape();
    positions_ = reader_.positions(0);
    for (int l = 0; l < s.layers; ++l) {
      KVD_EXPECT(reader_.positions(l) == positions_, "{}: layer {} has {} positions, layer 0 has {}", path, l, reader_.positions(l), positions_);
      for (std::int64_t p = 0; p < positions_; ++p)
        KVD_EXPECT(reader_.contains(l, p), "{}: layer {} misses position {} (positions must run from 0)", path, l, p);
    }
    if (end >= 0) {
      KVD_EXPECT(end >= 2 && end <= positions_, "{}: positions up to {} asked of a trace with {} per layer", path, end, positions_);
      positions_ = end;
    }
    KVD_EXPECT(steps >= 1 && steps < positions_, "{}: {} decode steps asked of a trace with {} positions per layer (need 1..{})", path, steps,
               positions_, positions_ - 1);
  }

  const ModelShape& shape() const { return reader_.shape(); }
  std::int64_t positions() const { return positions_; }

  StreamTrace stream(int layer, int kv_head) const {
    const ModelShape& s = shape();
    KVD_EXPECT(layer >= 0 && layer < s.layers && kv_head >= 0 && kv_head < s.kv_heads,
               "recorded trace: stream (layer {}, KV head {}) outside {} layers x {} KV heads", layer, kv_head, s.layers, s.kv_heads);
    StreamTrace t;
    t.layer = layer;
    t.kv_head = kv_head;
    t.head_dim = s.head_dim;
    t.group = s.group();
    t.prefix = positions_ - steps_;
    t.steps = steps_;
    const auto d = static_cast<std::size_t>(s.head_dim);
    t.keys.resize(static_cast<std::size_t>(positions_) * d);
    t.values.resize(t.keys.size());
    t.queries.resize(static_cast<std::size_t>(steps_) * t.group * d);
    t.observed = std::min(kObservedQueries, t.prefix);
    t.observed_queries.resize(static_cast<std::size_t>(t.observed) * t.group * d);
    std::vector<float> q, k, v;
    for (std::int64_t p = 0; p < positions_; ++p) {
      reader_.read(layer, p, q, k, v);
      std::copy_n(k.data() + kv_head * d, d, t.keys.data() + static_cast<std::size_t>(p) * d);
      std::copy_n(v.data() + kv_head * d, d, t.values.data() + static_cast<std::size_t>(p) * d);
      const float* group_q = q.data() + static_cast<std::size_t>(kv_head) * t.group * d;
      if (p >= t.prefix) std::copy_n(group_q, t.group * d, t.queries.data() + static_cast<std::size_t>(p - t.prefix) * t.group * d);
      else if (p >= t.prefix - t.observed)
        std::copy_n(group_q, t.group * d, t.observed_queries.data() + static_cast<std::size_t>(p - (t.prefix - t.observed)) * t.group * d);
    }
    return t;
  }

 private:
  TraceReader reader_;
  std::int64_t steps_;
  std::int64_t positions_ = 0;
};

}  // namespace kvdrive::eval
