// The decoder's dense linear algebra on the CPU: y = W x (decode) and Y = X W^T (prefill), with
// W row-major [out][in] in float. Output rows are split across the thread pool; each dot product
// keeps 8 independent AVX2 accumulators (4 rows x 2), so decode streams the weights at memory
// speed. The summation order is fixed: results do not depend on the thread count. CpuLinear wraps
// them as the decoder's Linear policy.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/core/thread_pool.hpp"

namespace kvdrive::llama {

namespace detail {

/// y[r] = W[r] . x for the rows [r0, r0 + 4), or fewer at the end.
inline void dot_rows(const float* w, const float* x, float* y, std::size_t rows, std::size_t in) {
#if KVD_CPU_AVX2
  if (rows == 4 && in % 16 == 0) {
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    const float* w0 = w;
    const float* w1 = w + in;
    const float* w2 = w + 2 * in;
    const float* w3 = w + 3 * in;
    for (std::size_t j = 0; j < in; j += 16) {
      const __m256 xa = _mm256_loadu_ps(x + j), xb = _mm256_loadu_ps(x + j + 8);
      acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + j), xa, acc[0]);
      acc[1] = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + j + 8), xb, acc[1]);
      acc[2] = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + j), xa, acc[2]);
      acc[3] = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + j + 8), xb, acc[3]);
      acc[4] = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + j), xa, acc[4]);
      acc[5] = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + j + 8), xb, acc[5]);
      acc[6] = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + j), xa, acc[6]);
      acc[7] = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + j + 8), xb, acc[7]);
    }
    __m256 pair[8] = {_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]),
                      _mm256_add_ps(acc[4], acc[5]), _mm256_add_ps(acc[6], acc[7]),
                      _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    alignas(32) float s[8];
    _mm256_store_ps(s, attention::detail::sum8(pair));
    for (int r = 0; r < 4; ++r) y[r] = s[r];
    return;
  }
#endif
  for (std::size_t r = 0; r < rows; ++r) {
    const float* wr = w + r * in;
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (std::size_t j = 0; j < in; ++j) part[j & 7] += wr[j] * x[j];
    y[r] = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
  }
}

}  // namespace detail

/// y[out] = W[out][in] x[in].
inline void matvec(ThreadPool& pool, const float* w, const float* x, float* y, std::size_t out, std::size_t in) {
  constexpr std::size_t kRowsPerTask = 64;
  const std::size_t tasks = (out + kRowsPerTask - 1) / kRowsPerTask;
  pool.parallel_for(tasks, [&](std::size_t t) {
    const std::size_t r1 = std::min(out, (t + 1) * kRowsPerTask);
    for (std::size_t r = t * kRowsPerTask; r < r1; r += 4)
      detail::dot_rows(w + r * in, x, y + r, std::min<std::size_t>(4, r1 - r), in);
  });
}

/// Y[n][out] = X[n][in] W^T: each weight row block is read once for all n inputs.
inline void matmul(ThreadPool& pool, const float* w, const float* x, float* y, std::size_t n, std::size_t out,
                   std::size_t in) {
  constexpr std::size_t kRowsPerTask = 16;
  const std::size_t tasks = (out + kRowsPerTask - 1) / kRowsPerTask;
  pool.parallel_for(tasks, [&](std::size_t t) {
    const std::size_t r1 = std::min(out, (t + 1) * kRowsPerTask);
    float tmp[4];
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t r = t * kRowsPerTask; r < r1; r += 4) {
        const std::size_t rows = std::min<std::size_t>(4, r1 - r);
        detail::dot_rows(w + r * in, x + i * in, tmp, rows, in);
        for (std::size_t k = 0; k < rows; ++k) y[i * out + r + k] = tmp[k];
      }
  });
}

/// The decoder's Linear policy on the CPU: matvec and matmul above on the decoder's thread pool.
/// A Linear policy is constructed from the pool and offers these two calls (CublasLinear in
/// cublas_linear.hpp runs them with cuBLAS).
class CpuLinear {
 public:
  explicit CpuLinear(ThreadPool& pool) : pool_(pool) {}
  static constexpr const char* name() { return "cpu"; }
  void matvec(const float* w, const float* x, float* y, std::size_t out, std::size_t in) { llama::matvec(pool_, w, x, y, out, in); }
  void matmul(const float* w, const float* x, float* y, std::size_t n, std::size_t out, std::size_t in) {
    llama::matmul(pool_, w, x, y, n, out, in);
  }

 private:
  ThreadPool& pool_;
};

}  // namespace kvdrive::llama
