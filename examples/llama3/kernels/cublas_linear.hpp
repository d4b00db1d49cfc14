// CublasLinear: the decoder's Linear policy on a GPU (kvd-llama --device cuda). Each weight
// matrix is copied to device memory on first use (float, row-major [out][in], kept for the
// decoder's life; a matrix in GGUF blocks is dequantized to float on the host first, since cuBLAS
// computes in float); each call uploads its input rows, runs cublasSgemv (one row) or cublasSgemm
// (a prefill chunk) and downloads the output. cuBLAS is column-major: a row-major [out][in] W is
// a column-major [in][out] matrix, so y = W x is Sgemv with op T, and Y[n][out] = X W^T is
// Sgemm(T, N) with m = out, n = n, k = in.
#pragma once

#include <cstddef>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "kvdrive/cuda/check.cuh"
#include "kvdrive/cuda/device_buffer.cuh"
#include "kvdrive/cuda/stream.cuh"
#include "kernels/matrix.hpp"
#include "kernels/quant.hpp"

namespace kvdrive::llama {

#define KVD_CUBLAS_CHECK(call)                                                                                                 \
  do {                                                                                                                         \
    const cublasStatus_t kvd_blas_ = (call);                                                                                   \
    if (kvd_blas_ != CUBLAS_STATUS_SUCCESS)                                                                                    \
      ::kvdrive::fail("cuBLAS error at {}:{}: {} returned {} ({})", __FILE__, __LINE__, #call, cublasGetStatusName(kvd_blas_), \
                      cublasGetStatusString(kvd_blas_));                                                                       \
  } while (0)

class CublasLinear {
 public:
  explicit CublasLinear(ThreadPool&) {
    KVD_CUBLAS_CHECK(cublasCreate(&handle_));
    if (const cublasStatus_t e = cublasSetStream(handle_, stream_.get()); e != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(std::exchange(handle_, nullptr));
      KVD_CUBLAS_CHECK(e);
    }
  }
  CublasLinear(const CublasLinear&) = delete;
  CublasLinear& operator=(const CublasLinear&) = delete;
  ~CublasLinear() {
    if (handle_) cublasDestroy(handle_);
  }

  static constexpr const char* name() { return "cublas"; }

  /// y[out] = W[out][in] x[in].
  void matvec(const Matrix& w, const float* x, float* y) { matmul(w, x, y, 1); }

  /// Y[n][out] = X[n][in] W^T.
  void matmul(const Matrix& w, const float* x, float* y, std::size_t n) {
    const auto out = static_cast<std::size_t>(w.rows), in = static_cast<std::size_t>(w.cols);
    KVD_EXPECT(n > 0 && out > 0 && in > 0 && out <= kMaxDim && in <= kMaxDim && n <= kMaxDim, "CublasLinear: shape {} x {} x {} outside 1..{}", n,
               out, in, kMaxDim);
    const float* dw = weight(w);
    grow(x_, n * in);
    grow(y_, n * out);
    KVD_CUDA_CHECK(cudaMemcpyAsync(x_.data(), x, n * in * sizeof(float), cudaMemcpyHostToDevice, stream_.get()));
    const float one = 1.0f, zero = 0.0f;
    const int m_ = static_cast<int>(out), n_ = static_cast<int>(n), k_ = static_cast<int>(in);
    if (n == 1) KVD_CUBLAS_CHECK(cublasSgemv(handle_, CUBLAS_OP_T, k_, m_, &one, dw, k_, x_.data(), 1, &zero, y_.data(), 1));
    else KVD_CUBLAS_CHECK(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, m_, n_, k_, &one, dw, k_, x_.data(), k_, &zero, y_.data(), m_));
    KVD_CUDA_CHECK(cudaMemcpyAsync(y, y_.data(), n * out * sizeof(float), cudaMemcpyDeviceToHost, stream_.get()));
    stream_.synchronize();
  }

  /// Bytes of weights held in device memory.
  std::size_t weight_bytes() const { return weight_bytes_; }

 private:
  static constexpr std::size_t kMaxDim = std::size_t{1} << 30;

  const float* weight(const Matrix& w) {
    const std::size_t elems = static_cast<std::size_t>(w.rows) * static_cast<std::size_t>(w.cols);
    const void* key = w.data;
    auto it = weights_.find(key);
    if (it == weights_.end()) {
      std::vector<float> dequantized;
      const float* host = w.floats();
      if (host == nullptr) {
        dequantized.resize(elems);
        for (std::int64_t r = 0; r < w.rows; ++r)
          dequantize_row(w.type, w.row(r), dequantized.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(w.cols), w.cols);
        host = dequantized.data();
      }
      cuda::DeviceBuffer<float> buf(elems);
      // On the stream the GEMMs run on, and waited for: a pageable cudaMemcpy may return before
      // the bytes reach the device, and stream_ does not wait for the legacy default stream.
      KVD_CUDA_CHECK(cudaMemcpyAsync(buf.data(), host, elems * sizeof(float), cudaMemcpyHostToDevice, stream_.get()));
      stream_.synchronize();
      weight_bytes_ += elems * sizeof(float);
      it = weights_.emplace(key, std::move(buf)).first;
    }
    KVD_EXPECT(it->second.size() == elems, "CublasLinear: the weight at {} was used with {} then {} elements", key, it->second.size(), elems);
    return it->second.data();
  }
  static void grow(cuda::DeviceBuffer<float>& b, std::size_t n) {
    if (b.size() < n) b = cuda::DeviceBuffer<float>(n);
  }

  cuda::Stream stream_;
  cublasHandle_t handle_ = nullptr;
  std::unordered_map<const void*, cuda::DeviceBuffer<float>> weights_;
  cuda::DeviceBuffer<float> x_, y_;
  std::size_t weight_bytes_ = 0;
};

}  // namespace kvdrive::llama
