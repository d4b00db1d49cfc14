// Rotary position embedding as Llama applies it (rotate-half), on rows of floats: what the
// synthetic traces (eval/synthetic.hpp) apply to their pre-RoPE keys and queries, and what a
// test applies to check them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvdrive::eval {

/// Rotates rows of head_dim floats with rotate-half RoPE (Llama's layout: pair i is dims
/// (i, i + head_dim/2), angle position x theta^(-2i/head_dim)); row r sits at position
/// first_position + r. Angles are evaluated exactly (std::cos/std::sin) at every 64th position
/// and advanced by angle addition in double between, so long contexts stay accurate.
inline void rope_rotate_rows(float* rows, std::int64_t count, int head_dim, std::int64_t first_position, double theta, std::size_t stride = 0) {
  if (count <= 0) return;
  if (stride == 0) stride = static_cast<std::size_t>(head_dim);
  const int half = head_dim / 2;
  constexpr int kBlock = 64;
  std::vector<double> freq(static_cast<std::size_t>(half)), step_c(static_cast<std::size_t>(half) * kBlock), step_s(step_c.size()),
      c(static_cast<std::size_t>(half)), s(c.size());
  for (int i = 0; i < half; ++i) {
    freq[i] = std::pow(theta, -2.0 * i / head_dim);
    for (int r = 0; r < kBlock; ++r) {
      step_c[static_cast<std::size_t>(r) * half + i] = std::cos(r * freq[i]);
      step_s[static_cast<std::size_t>(r) * half + i] = std::sin(r * freq[i]);
    }
  }
  for (std::int64_t r0 = 0; r0 < count; r0 += kBlock) {
    const std::int64_t base = first_position + r0;
    for (int i = 0; i < half; ++i) {
      c[i] = std::cos(static_cast<double>(base) * freq[i]);
      s[i] = std::sin(static_cast<double>(base) * freq[i]);
    }
    const std::int64_t end = std::min<std::int64_t>(count, r0 + kBlock);
    for (std::int64_t r = r0; r < end; ++r) {
      float* x = rows + static_cast<std::size_t>(r) * stride;
      const double* sc = step_c.data() + static_cast<std::size_t>(r - r0) * half;
      const double* ss = step_s.data() + static_cast<std::size_t>(r - r0) * half;
      for (int i = 0; i < half; ++i) {
        const double ci = c[i] * sc[i] - s[i] * ss[i], si = s[i] * sc[i] + c[i] * ss[i];
        const double x0 = x[i], x1 = x[i + half];
        x[i] = static_cast<float>(x0 * ci - x1 * si);
        x[i + half] = static_cast<float>(x0 * si + x1 * ci);
      }
    }
  }
}

}  // namespace kvdrive::eval
