// Matrix: a weight matrix of the decoder as it lies in memory, row-major [rows][cols] (y = W x),
// each row a run of `type`'s blocks (float for F32, GGUF block formats otherwise). Weights stay
// in their blocks; the Linear policies (linear.hpp, cublas_linear.hpp) compute from them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/ggml_type.hpp"

namespace kvdrive::llama {

struct Matrix {
  const std::byte* data = nullptr;
  GgmlType type = GgmlType::F32;
  std::int64_t rows = 0, cols = 0;

  /// A float matrix.
  static Matrix f32(const float* p, std::int64_t rows, std::int64_t cols) {
    return {reinterpret_cast<const std::byte*>(p), GgmlType::F32, rows, cols};
  }
  explicit operator bool() const { return data != nullptr; }
  bool is_f32() const { return type == GgmlType::F32; }
  /// The float data of an F32 matrix (nullptr otherwise).
  const float* floats() const { return is_f32() ? reinterpret_cast<const float*>(data) : nullptr; }
  std::size_t row_bytes() const { return ggml_row_bytes(type, cols); }
  std::size_t bytes() const { return row_bytes() * static_cast<std::size_t>(rows); }
  const std::byte* row(std::int64_t r) const { return data + static_cast<std::size_t>(r) * row_bytes(); }
};

}  // namespace kvdrive::llama
