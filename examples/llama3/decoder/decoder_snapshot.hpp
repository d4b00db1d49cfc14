// What a prefill gave the manager (every layer's K/V, the warm-up queries, the last logits), for
// benchmarks that compare managers on the same work: Decoder::keep_prefill() records a
// PrefillSnapshot, and Decoder::prefill_from() hands it to another decoder's manager without
// computing the prompt again, so that decoder continues exactly as if it had prefilled itself.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvdrive/core/dtype.hpp"
#include "kvdrive/core/error.hpp"
#include "model/model.hpp"

namespace kvdrive::llama {

/// What a prefill gave the manager, for another manager to start from (Decoder::prefill_from).
struct PrefillSnapshot {
  DType dtype = DType::f32;  ///< the KV dtype the prefill's attention rounded K/V to
  std::int64_t tokens = 0;
  int chunk = 0;                          ///< the prefill chunk the K/V were handed over in
  std::vector<std::vector<float>> k, v;   ///< [layer]: [tokens][kv_heads][head_dim], after RoPE
  std::int64_t observed = 0;              ///< warm-up queries kept (the prompt's last positions)
  std::vector<std::vector<float>> obs_q;  ///< [layer]: [observed][heads][head_dim]
  std::vector<float> logits;              ///< after the prompt's last token
};

/// prefill_from's checks of a snapshot against a model `c`, its manager's KV `dtype` and a decoder
/// that warms up from `observed` queries.
inline void check_snapshot(const PrefillSnapshot& snap, const LlamaConfig& c, DType dtype, int observed) {
  KVD_EXPECT(snap.tokens > 0 && snap.chunk > 0 && snap.k.size() == static_cast<std::size_t>(c.layers) && snap.v.size() == snap.k.size() &&
                 snap.logits.size() == static_cast<std::size_t>(c.vocab),
             "prefill_from: the snapshot ({} tokens, {} layers) does not fit this model ({} layers)", snap.tokens, snap.k.size(), c.layers);
  KVD_EXPECT(snap.tokens <= c.max_seq, "prefill_from: {} tokens exceed the model's context {}", snap.tokens, c.max_seq);
  // Prefill's attention saw the K/V rounded to the KV dtype: another dtype would have computed
  // other later-layer K/V, so the snapshot would not be this decoder's own prefill.
  KVD_EXPECT(snap.dtype == dtype, "prefill_from: the snapshot was taken with {} KV, this manager stores {}", dtype_name(snap.dtype),
             dtype_name(dtype));
  KVD_EXPECT(snap.observed >= 0 && snap.observed <= snap.tokens && (snap.observed == 0 || snap.obs_q.size() == static_cast<std::size_t>(c.layers)),
             "prefill_from: the snapshot's {} warm-up queries do not fit its {} tokens and {} layers", snap.observed, snap.tokens, c.layers);
  for (const auto& q : snap.obs_q)
    KVD_EXPECT(q.size() == static_cast<std::size_t>(snap.observed) * static_cast<std::size_t>(c.heads) * static_cast<std::size_t>(c.head_dim()),
               "prefill_from: a layer's warm-up queries hold the wrong number of values");
  KVD_EXPECT(observed == 0 || snap.observed >= std::min<std::int64_t>(observed, snap.tokens),
             "prefill_from: this decoder warms up from {} queries, the snapshot kept {}", observed, snap.observed);
  const auto row = static_cast<std::size_t>(c.kv_heads) * static_cast<std::size_t>(c.head_dim());
  for (int l = 0; l < c.layers; ++l)
    KVD_EXPECT(snap.k[static_cast<std::size_t>(l)].size() == static_cast<std::size_t>(snap.tokens) * row &&
                   snap.v[static_cast<std::size_t>(l)].size() == snap.k[static_cast<std::size_t>(l)].size(),
               "prefill_from: layer {} holds the wrong number of K/V values", l);
}

/// The snapshot's last `obs` warm-up queries of every layer.
inline std::vector<std::vector<float>> last_queries(const PrefillSnapshot& snap, std::int64_t obs, const LlamaConfig& c) {
  std::vector<std::vector<float>> q(static_cast<std::size_t>(c.layers));
  const auto qrow = static_cast<std::size_t>(c.heads) * static_cast<std::size_t>(c.head_dim());
  for (int l = 0; l < c.layers; ++l) {
    const auto& src = snap.obs_q[static_cast<std::size_t>(l)];
    q[static_cast<std::size_t>(l)].assign(src.end() - static_cast<std::ptrdiff_t>(static_cast<std::size_t>(obs) * qrow), src.end());
  }
  return q;
}

}  // namespace kvdrive::llama
