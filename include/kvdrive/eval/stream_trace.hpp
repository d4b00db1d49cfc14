// StreamTrace: what one stream (one layer, one KV head) of a decoder saw, in the form every
// evaluation replays: all keys and values in position order, the group's queries for each
// decode step, and the queries of the prompt's last positions (for warm-up placement). Step s
// decodes the token at position prefix + s; its query attends to the keys at positions
// [0, prefix + s], its own included. Keys and queries are after RoPE, as float.
// Synthetic traces (eval/synthetic.hpp) and recorded ones (eval/recorded.hpp) both produce it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvdrive::eval {

struct StreamTrace {
  int layer = 0;
  int kv_head = 0;
  int head_dim = 0;
  int group = 1;               ///< query heads sharing this KV head
  std::int64_t prefix = 0;     ///< prompt tokens, present before step 0
  std::int64_t steps = 0;      ///< decode steps
  std::vector<float> keys;     ///< [prefix + steps][head_dim]
  std::vector<float> values;   ///< [prefix + steps][head_dim]
  std::vector<float> queries;  ///< [steps][group][head_dim]
  /// The group's queries at the prompt's last `observed` positions (prefix - observed ..
  /// prefix - 1): what warm-up placement sees at the end of prefill. May be 0.
  std::int64_t observed = 0;
  std::vector<float> observed_queries;  ///< [observed][group][head_dim]

  std::int64_t tokens() const { return prefix + steps; }
  const float* key(std::int64_t position) const { return keys.data() + static_cast<std::size_t>(position) * head_dim; }
  const float* value(std::int64_t position) const { return values.data() + static_cast<std::size_t>(position) * head_dim; }
  /// The group's query heads at step s: [group][head_dim].
  const float* query(std::int64_t step) const { return queries.data() + static_cast<std::size_t>(step) * group * head_dim; }
};

}  // namespace kvdrive::eval
