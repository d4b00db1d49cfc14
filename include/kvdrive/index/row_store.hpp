// RowStore: fixed-width rows appended one page at a time and stored in an element dtype (the KV
// dtype, per the rule that index data costs what the KV costs). Rows live in blocks of
// block_rows rows (kBlockRows unless the owner knows its final size), so growing never moves (or
// re-faults) what is already stored: a decode step that seals a page must not copy the whole
// index. Rows within a block are contiguous, which the scoring loops rely on to stream them.
// bytes() counts the rows stored, not the unused tail of the last block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvdrive/attention/convert.hpp"
#include "kvdrive/core/dtype.hpp"

namespace kvdrive::index {

/// Converts n floats to dtype `t` (round to nearest even) at dst.
inline void store_row(DType t, const float* src, std::byte* dst, std::size_t n) {
  dispatch_dtype(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = reinterpret_cast<T*>(dst);
    for (std::size_t i = 0; i < n; ++i) out[i] = from_float<T>(src[i]);
  });
}

/// Converts n elements of dtype `t` at src to floats at dst (exact): store_row's inverse, for
/// rows an index keeps in raw bytes.
inline void load_row(DType t, const std::byte* src, float* dst, std::size_t n) {
  dispatch_dtype(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    attention::to_float_block(reinterpret_cast<const T*>(src), dst, n);
  });
}

/// Rounds n floats in place to what dtype `t` stores (identity for f32): index data is computed
/// on the values the index actually keeps.
inline void round_to_dtype(DType t, float* x, std::size_t n) {
  if (t == DType::f32) return;
  dispatch_dtype(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (std::size_t i = 0; i < n; ++i) x[i] = to_float(from_float<T>(x[i]));
  });
}

class RowStore {
 public:
  static constexpr std::int64_t kBlockRows = 1024;

  RowStore() = default;
  explicit RowStore(std::size_t width, DType dtype = DType::f32, std::int64_t block_rows = kBlockRows)
      : width_(width), dtype_(dtype), row_bytes_(width * dtype_size(dtype)), block_rows_(block_rows > 0 ? block_rows : 1) {}

  std::size_t width() const { return width_; }
  DType dtype() const { return dtype_; }
  std::size_t row_bytes() const { return row_bytes_; }
  std::int64_t rows() const { return rows_; }
  std::size_t bytes() const { return static_cast<std::size_t>(rows_) * row_bytes_; }

  /// Appends one row of width() floats, converted to the store's dtype.
  void push(const float* row) {
    if (rows_ % block_rows_ == 0) blocks_.push_back(std::make_unique_for_overwrite<std::byte[]>(static_cast<std::size_t>(block_rows_) * row_bytes_));
    store_row(dtype_, row, blocks_.back().get() + static_cast<std::size_t>(rows_ % block_rows_) * row_bytes_, width_);
    ++rows_;
  }

  const std::byte* row_data(std::int64_t i) const {
    return blocks_[static_cast<std::size_t>(i / block_rows_)].get() + static_cast<std::size_t>(i % block_rows_) * row_bytes_;
  }
  /// Row i as elements of T, which must be the store's dtype.
  template <class T>
  const T* row(std::int64_t i) const {
    return reinterpret_cast<const T*>(row_data(i));
  }
  /// Row i converted to float.
  void row_float(std::int64_t i, float* out) const { load_row(dtype_, row_data(i), out, width_); }

  /// Calls f(first_row, count, const T* rows) for the contiguous runs that cover [begin, end).
  template <class T, class F>
  void for_runs(std::int64_t begin, std::int64_t end, F&& f) const {
    while (begin < end) {
      const std::int64_t block_end = (begin / block_rows_ + 1) * block_rows_;
      const std::int64_t stop = block_end < end ? block_end : end;
      f(begin, stop - begin, row<T>(begin));
      begin = stop;
    }
  }

 private:
  std::size_t width_ = 0;
  DType dtype_ = DType::f32;
  std::size_t row_bytes_ = 0;
  std::int64_t block_rows_ = kBlockRows;
  std::int64_t rows_ = 0;
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
};

}  // namespace kvdrive::index
