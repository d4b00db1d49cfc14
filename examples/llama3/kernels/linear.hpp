// The decoder's dense linear algebra on the CPU: y = W x (decode) and Y = X W^T (prefill), with
// W a Matrix (matrix.hpp): row-major [out][in] in F32, F16, BF16 or one of GGUF's block formats
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K). Output rows are split across the thread pool;
// each row's sum has one fixed order, so results do not depend on the thread count, and matmul's
// row for an input equals matvec's, bit for bit.
//   F32:       float activations, 4 rows x 2 AVX2 accumulators of 8 lanes per dot product;
//   F16, BF16: float activations, one row at a time, 4 accumulators of 8 lanes (dot_row_half);
//   blocks:    the activations are quantized to int8 blocks once per call, and each weight block
//              meets them in an exact integer dot (quant_dot.hpp); prefill takes the weight rows
//              with 4 inputs at a time, so a weight block is decoded once per 4 inputs.
// CpuLinear wraps them as the decoder's Linear policy.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/half.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "kernels/matrix.hpp"
#include "kernels/quant.hpp"
#include "kernels/quant_dot.hpp"

namespace kvdrive::llama {

namespace detail {

/// y[r] = W[r] . x for the rows [r0, r0 + 4), or fewer at the end (float weights).
inline void dot_rows(const float* w, const float* x, float* y, std::size_t rows, std::size_t in) { quant::dot_rows_float(w, x, y, rows, in); }

/// Products below this many weight bytes (times inputs) run on the calling thread alone: a
/// fork-join of the polling pool costs ~0.5 us (bench_thread_pool, 2 threads), while SmolLM2's
/// smallest product (a 192 x 576 Q4_1 projection, 69 KiB) takes ~4 us on one thread; a sleeping
/// pool's fork-join (~8-30 us) would cost more than such a product. Which thread runs a row never
/// changes its result; tests set it to 0 to run small products on the pool.
inline std::size_t& inline_product_bytes() {
  static std::size_t bytes = std::size_t{32} << 10;
  return bytes;
}

template <class F>
void run_tasks(ThreadPool& pool, std::size_t tasks, std::size_t work_bytes, const F& f) {
  if (tasks <= 1 || work_bytes < inline_product_bytes() || pool.threads() == 1) {
    for (std::size_t t = 0; t < tasks; ++t) f(t);
  } else {
    pool.parallel_for(tasks, f);
  }
}

/// y[out] = W x for float W: 4 rows at a time (dot_rows_float).
inline void matvec_f32(ThreadPool& pool, const float* w, const float* x, float* y, std::size_t out, std::size_t in) {
  constexpr std::size_t kRowsPerTask = 64;
  const std::size_t tasks = (out + kRowsPerTask - 1) / kRowsPerTask;
  run_tasks(pool, tasks, out * in * sizeof(float), [&](std::size_t t) {
    const std::size_t r1 = std::min(out, (t + 1) * kRowsPerTask);
    for (std::size_t r = t * kRowsPerTask; r < r1; r += 4) quant::dot_rows_float(w + r * in, x, y + r, std::min<std::size_t>(4, r1 - r), in);
  });
}

inline void matmul_f32(ThreadPool& pool, const float* w, const float* x, float* y, std::size_t n, std::size_t out, std::size_t in) {
  constexpr std::size_t kRowsPerTask = 16;
  const std::size_t tasks = (out + kRowsPerTask - 1) / kRowsPerTask;
  run_tasks(pool, tasks, n * out * in * sizeof(float), [&](std::size_t t) {
    const std::size_t r1 = std::min(out, (t + 1) * kRowsPerTask);
    float tmp[4];
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t r = t * kRowsPerTask; r < r1; r += 4) {
        const std::size_t rows = std::min<std::size_t>(4, r1 - r);
        quant::dot_rows_float(w + r * in, x + i * in, tmp, rows, in);
        for (std::size_t k = 0; k < rows; ++k) y[i * out + r + k] = tmp[k];
      }
  });
}

/// Y[n][out] = X[n][in] W^T for F16/BF16 W, one row at a time (dot_row_half); a task's 16 rows
/// serve all n inputs.
template <class T>
void matmul_half(ThreadPool& pool, const T* w, const float* x, float* y, std::size_t n, std::size_t out, std::size_t in) {
  const std::size_t rows_per_task = n == 1 ? 64 : 16;
  const std::size_t tasks = (out + rows_per_task - 1) / rows_per_task;
  run_tasks(pool, tasks, n * out * in * sizeof(T), [&](std::size_t t) {
    const std::size_t r1 = std::min(out, (t + 1) * rows_per_task);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t r = t * rows_per_task; r < r1; ++r) y[i * out + r] = quant::dot_row_half(w + r * in, x + i * in, in);
  });
}

/// The activations of the calling thread's last quantized product (reused: no allocation per call).
inline quant::QuantizedActs& scratch_acts() {
  static thread_local quant::QuantizedActs acts;
  return acts;
}

inline void check_matrix(const Matrix& w) {
  KVD_EXPECT(w.data != nullptr && w.rows > 0 && w.cols > 0, "linear: empty {} x {} matrix", w.rows, w.cols);
  quant::expect_computable(w.type);
}

/// Y[n][w.rows] = X[n][w.cols] W^T for a quantized W. Decode (n = 1) splits the rows into about
/// 64 KiB of weights a task (at least 4 tasks a thread, for balance); prefill into 16 rows a task,
/// whose blocks stay in L1/L2 while all n inputs pass. Each row's result is the same either way.
inline void quantized_product(ThreadPool& pool, const Matrix& w, const float* x, float* y, std::size_t n) {
  quant::QuantizedActs& acts = scratch_acts();
  acts.quantize(quant::act_format(w.type), x, n, w.cols, &pool);
  std::int64_t rows_per_task = 16;
  if (n == 1) {
    const auto by_bytes = static_cast<std::int64_t>(w.bytes() / (64u << 10));
    const std::int64_t tasks = std::min<std::int64_t>(w.rows, std::max<std::int64_t>(by_bytes, 4 * pool.threads()));
    rows_per_task = (w.rows + tasks - 1) / tasks;
  }
  const std::size_t tasks = static_cast<std::size_t>((w.rows + rows_per_task - 1) / rows_per_task);
  run_tasks(pool, tasks, n * w.bytes(), [&](std::size_t t) {
    const std::int64_t r0 = static_cast<std::int64_t>(t) * rows_per_task;
    quant::quantized_rows(w, acts, n, y, r0, std::min(w.rows, r0 + rows_per_task));
  });
}

}  // namespace detail

/// y[out] = W[out][in] x[in] (float weights).
inline void matvec(ThreadPool& pool, const float* w, const float* x, float* y, std::size_t out, std::size_t in) {
  detail::matvec_f32(pool, w, x, y, out, in);
}

/// Y[n][out] = X[n][in] W^T (float weights): each weight row block is read once for all n inputs.
inline void matmul(ThreadPool& pool, const float* w, const float* x, float* y, std::size_t n, std::size_t out, std::size_t in) {
  detail::matmul_f32(pool, w, x, y, n, out, in);
}

/// y[w.rows] = W x[w.cols], for any computable type of W.
inline void matvec(ThreadPool& pool, const Matrix& w, const float* x, float* y) {
  detail::check_matrix(w);
  const auto out = static_cast<std::size_t>(w.rows), in = static_cast<std::size_t>(w.cols);
  switch (w.type) {
    case GgmlType::F32: return detail::matvec_f32(pool, w.floats(), x, y, out, in);
    case GgmlType::F16: return detail::matmul_half(pool, reinterpret_cast<const half*>(w.data), x, y, 1, out, in);
    case GgmlType::BF16: return detail::matmul_half(pool, reinterpret_cast<const bfloat16*>(w.data), x, y, 1, out, in);
    default: return detail::quantized_product(pool, w, x, y, 1);
  }
}

/// Y[n][w.rows] = X[n][w.cols] W^T, for any computable type of W; row i of Y equals matvec of
/// row i of X, bit for bit.
inline void matmul(ThreadPool& pool, const Matrix& w, const float* x, float* y, std::size_t n) {
  detail::check_matrix(w);
  if (n == 0) return;
  const auto out = static_cast<std::size_t>(w.rows), in = static_cast<std::size_t>(w.cols);
  switch (w.type) {
    case GgmlType::F32: return detail::matmul_f32(pool, w.floats(), x, y, n, out, in);
    case GgmlType::F16: return detail::matmul_half(pool, reinterpret_cast<const half*>(w.data), x, y, n, out, in);
    case GgmlType::BF16: return detail::matmul_half(pool, reinterpret_cast<const bfloat16*>(w.data), x, y, n, out, in);
    default: return detail::quantized_product(pool, w, x, y, n);
  }
}

/// The decoder's Linear policy on the CPU: matvec and matmul above on the decoder's thread pool.
/// A Linear policy is constructed from the pool and offers these calls (CublasLinear in
/// cublas_linear.hpp runs them with cuBLAS).
class CpuLinear {
 public:
  explicit CpuLinear(ThreadPool& pool) : pool_(pool) {}
  static constexpr const char* name() { return "cpu"; }
  void matvec(const Matrix& w, const float* x, float* y) { llama::matvec(pool_, w, x, y); }
  void matmul(const Matrix& w, const float* x, float* y, std::size_t n) { llama::matmul(pool_, w, x, y, n); }
  /// out[w.cols] = row `row` of w as floats (the token-embedding lookup).
  void embed_row(const Matrix& w, std::int64_t row, float* out) { llama::embed_row(w, row, out); }

  void matvec(const float* w, const float* x, float* y, std::size_t out, std::size_t in) { llama::matvec(pool_, w, x, y, out, in); }
  void matmul(const float* w, const float* x, float* y, std::size_t n, std::size_t out, std::size_t in) { llama::matmul(pool_, w, x, y, n, out, in); }

 private:
  ThreadPool& pool_;
};

}  // namespace kvdrive::llama
