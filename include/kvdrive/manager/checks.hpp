// The checks of KvManager's inputs: one view check for every [rows][heads][head_dim] float view
// the manager takes (keys, values, queries, outputs), and the checks of a step's inputs and of a
// warm-up's observation queries. Each failure names the argument and what was expected.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kvdrive/core/config.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/view.hpp"

namespace kvdrive::manager {

/// What a view must hold: `rows` rows (any, if negative), `heads` heads named `heads_name`, and
/// the config's head_dim, rows contiguous inside. Null data is allowed only for zero rows when
/// `null_if_empty`.
struct ViewShape {
  std::int64_t rows = -1;
  int heads = 0;
  const char* heads_name = "kv_heads";
  bool null_if_empty = false;
};

inline void check_view(const View<const float, 3>& v, const std::string& what, const ViewShape& want, int head_dim) {
  KVD_EXPECT(v.data != nullptr || (want.null_if_empty && v.extent(0) == 0), "{}: null data", what);
  KVD_EXPECT(want.rows < 0 || v.extent(0) == want.rows, "{}: {} rows, expected {} (the batch size)", what, v.extent(0), want.rows);
  KVD_EXPECT(v.extent(1) == want.heads, "{}: {} heads, expected {} = {}", what, v.extent(1), want.heads_name, want.heads);
  KVD_EXPECT(v.extent(2) == head_dim, "{}: head_dim {} does not match the config's {}", what, v.extent(2), head_dim);
  KVD_EXPECT(v.strides[2] == 1, "{}: innermost stride is {}, expected 1", what, v.strides[2]);
}

/// Keys or values: [rows][kv_heads][head_dim] (rows < 0: any number, as prefill takes).
inline void check_kv_view(const Config& c, const View<const float, 3>& v, const std::string& what, std::int64_t rows) {
  check_view(v, what, ViewShape{rows, c.shape.kv_heads, "kv_heads", true}, c.shape.head_dim);
}

/// Queries or outputs: [rows][q_heads][head_dim].
inline void check_q_view(const Config& c, const View<const float, 3>& v, const std::string& what, std::int64_t rows) {
  check_view(v, what, ViewShape{rows, c.shape.q_heads, "q_heads", false}, c.shape.head_dim);
}

/// attend()'s and tune()'s views against the batch; `usable(id)` checks each sequence.
template <class Usable>
void check_step_inputs(const Config& c, std::span<const std::uint64_t> batch, View<const float, 3> q, View<const float, 3> k, View<const float, 3> v,
                       View<float, 3> out, Usable&& usable) {
  KVD_EXPECT(!batch.empty(), "attend: empty batch");
  const auto b = static_cast<std::int64_t>(batch.size());
  check_q_view(c, q, "attend: q", b);
  check_q_view(c, View<const float, 3>(out), "attend: out", b);
  check_kv_view(c, k, "attend: k", b);
  check_kv_view(c, v, "attend: v", b);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    usable(batch[i]);
    for (std::size_t j = 0; j < i; ++j) KVD_EXPECT(batch[i] != batch[j], "attend: sequence {} appears twice in the batch", batch[i]);
  }
}

/// Observation queries [observed][q_heads][head_dim] for a layer holding `tokens` prompt tokens.
inline void check_observation(const Config& c, View<const float, 3> q_obs, std::int64_t tokens, const char* what) {
  check_q_view(c, q_obs, fmt::format("{}: q_obs", what), q_obs.extent(0));
  KVD_EXPECT(q_obs.extent(0) >= 1 && q_obs.extent(0) <= tokens, "{}: {} observation queries for a prompt of {} tokens", what, q_obs.extent(0),
             tokens);
}

}  // namespace kvdrive::manager
