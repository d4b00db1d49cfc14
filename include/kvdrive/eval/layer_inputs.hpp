// LayerInputs: what KvManager needs to replay one layer of a trace (synthetic or recorded) as a
// decoder would drive it: the prompt's keys and values of every KV head, the prompt's last
// queries for warm-up, and each decode step's queries and new key and value. kvd-eval
// --pipeline and bench_pipeline drive managers with it; per-stream evaluations use StreamTrace.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/view.hpp"
#include "kvdrive/eval/stream_trace.hpp"

namespace kvdrive::eval {

struct LayerInputs {
  int kv_heads = 0, group = 1, head_dim = 0;
  std::int64_t prefix = 0, steps = 0, observed = 0;
  std::vector<float> k, v;              ///< prompt: [prefix][kv_heads][head_dim]
  std::vector<float> obs_q;             ///< [observed][q_heads][head_dim]
  std::vector<float> q_steps;           ///< [steps][q_heads][head_dim]
  std::vector<float> k_steps, v_steps;  ///< [steps][kv_heads][head_dim]

  int q_heads() const { return group * kv_heads; }
  View<const float, 3> prompt_k() const { return make_view(k, prefix, kv_heads, head_dim); }
  View<const float, 3> prompt_v() const { return make_view(v, prefix, kv_heads, head_dim); }
  View<const float, 3> observation_queries() const { return make_view(obs_q, observed, q_heads(), head_dim); }
  /// Step s's rows: queries [q_heads][head_dim], new key and value [kv_heads][head_dim].
  const float* q(std::int64_t s) const { return q_steps.data() + static_cast<std::size_t>(s) * q_heads() * head_dim; }
  const float* k_new(std::int64_t s) const { return k_steps.data() + static_cast<std::size_t>(s) * kv_heads * head_dim; }
  const float* v_new(std::int64_t s) const { return v_steps.data() + static_cast<std::size_t>(s) * kv_heads * head_dim; }
};

/// The inputs of `layer` of a trace source (SyntheticTrace, RecordedTrace: anything with
/// shape() and stream(layer, kv_head)), for its first `kv_heads` KV heads (0: all of them).
template <class Source>
LayerInputs layer_inputs(const Source& source, int layer, int kv_heads = 0) {
  const int all = source.shape().kv_heads;
  KVD_EXPECT(kv_heads >= 0 && kv_heads <= all, "layer_inputs: {} KV heads of a trace with {}", kv_heads, all);
  LayerInputs in;
  in.kv_heads = kv_heads == 0 ? all : kv_heads;
  const int kvh = in.kv_heads;
  for (int h = 0; h < kvh; ++h) {
    const StreamTrace st = source.stream(layer, h);
    const int d = st.head_dim, g = st.group;
    if (h == 0) {
      in.group = g;
      in.head_dim = d;
      in.prefix = st.prefix;
      in.steps = st.steps;
      in.observed = st.observed;
      in.k.assign(static_cast<std::size_t>(st.prefix) * kvh * d, 0.0f);
      in.v.assign(in.k.size(), 0.0f);
      in.obs_q.assign(static_cast<std::size_t>(st.observed) * g * kvh * d, 0.0f);
      in.q_steps.assign(static_cast<std::size_t>(st.steps) * g * kvh * d, 0.0f);
      in.k_steps.assign(static_cast<std::size_t>(st.steps) * kvh * d, 0.0f);
      in.v_steps.assign(in.k_steps.size(), 0.0f);
    }
    KVD_EXPECT(st.head_dim == in.head_dim && st.group == in.group && st.prefix == in.prefix && st.steps == in.steps && st.observed == in.observed,
               "layer_inputs: layer {} head {} differs in shape from head 0", layer, h);
    const auto du = static_cast<std::size_t>(d), gd = static_cast<std::size_t>(g) * du;
    const auto hu = static_cast<std::size_t>(h), kvu = static_cast<std::size_t>(kvh);
    for (std::int64_t t = 0; t < st.prefix; ++t) {
      std::copy_n(st.key(t), d, in.k.data() + (static_cast<std::size_t>(t) * kvu + hu) * du);
      std::copy_n(st.value(t), d, in.v.data() + (static_cast<std::size_t>(t) * kvu + hu) * du);
    }
    for (std::int64_t i = 0; i < st.observed; ++i)
      std::copy_n(st.observed_queries.data() + static_cast<std::size_t>(i) * gd, gd, in.obs_q.data() + (static_cast<std::size_t>(i) * kvu + hu) * gd);
    for (std::int64_t s = 0; s < st.steps; ++s) {
      std::copy_n(st.query(s), gd, in.q_steps.data() + (static_cast<std::size_t>(s) * kvu + hu) * gd);
      std::copy_n(st.key(st.prefix + s), d, in.k_steps.data() + (static_cast<std::size_t>(s) * kvu + hu) * du);
      std::copy_n(st.value(st.prefix + s), d, in.v_steps.data() + (static_cast<std::size_t>(s) * kvu + hu) * du);
    }
  }
  return in;
}

/// Decode step s of a batch of sequences (one LayerInputs each, alike in shape), in the layout
/// KvManager::attend takes: q [batch][q_heads][head_dim], k and v [batch][kv_heads][head_dim].
inline void batch_step(std::span<const LayerInputs> batch, std::int64_t s, std::vector<float>& q, std::vector<float>& k, std::vector<float>& v) {
  KVD_EXPECT(!batch.empty(), "batch_step: an empty batch");
  const auto qn = static_cast<std::size_t>(batch[0].q_heads()) * batch[0].head_dim,
             kn = static_cast<std::size_t>(batch[0].kv_heads) * batch[0].head_dim;
  q.resize(batch.size() * qn);
  k.resize(batch.size() * kn);
  v.resize(batch.size() * kn);
  for (std::size_t b = 0; b < batch.size(); ++b) {
    const LayerInputs& in = batch[b];
    KVD_EXPECT(static_cast<std::size_t>(in.q_heads()) * in.head_dim == qn && static_cast<std::size_t>(in.kv_heads) * in.head_dim == kn && s >= 0 &&
                   s < in.steps,
               "batch_step: sequence {} differs in shape from the first, or has no step {}", b, s);
    std::copy_n(in.q(s), qn, q.data() + b * qn);
    std::copy_n(in.k_new(s), kn, k.data() + b * kn);
    std::copy_n(in.v_new(s), kn, v.data() + b * kn);
  }
}

}  // namespace kvdrive::eval
