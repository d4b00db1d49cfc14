// CodeStore<W>: fixed-width rows of raw code words (SimHash sign bits as 64-bit words, product
// quantisation codes as bytes) appended one page at a time. RowStore's sibling for data that is
// not a KV-dtype value: the same blocks of kBlockRows rows, so growing never moves what is
// already stored, and rows within a block are contiguous for the scoring loops to stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

namespace kvdrive::index {

template <class W>
class CodeStore {
  static_assert(std::is_trivially_copyable_v<W>, "CodeStore holds raw words");

 public:
  static constexpr std::int64_t kBlockRows = 1024;

  CodeStore() = default;
  explicit CodeStore(std::size_t width) : width_(width) {}

  std::size_t width() const { return width_; }
  std::int64_t rows() const { return rows_; }
  std::size_t bytes() const { return static_cast<std::size_t>(rows_) * width_ * sizeof(W); }

  /// Appends one row of width() words.
  void push(const W* row) {
    if (rows_ % kBlockRows == 0) blocks_.push_back(std::make_unique_for_overwrite<W[]>(static_cast<std::size_t>(kBlockRows) * width_));
    W* dst = blocks_.back().get() + static_cast<std::size_t>(rows_ % kBlockRows) * width_;
    for (std::size_t i = 0; i < width_; ++i) dst[i] = row[i];
    ++rows_;
  }

  const W* row(std::int64_t i) const {
    return blocks_[static_cast<std::size_t>(i / kBlockRows)].get() + static_cast<std::size_t>(i % kBlockRows) * width_;
  }

  /// Calls f(first_row, count, const W* rows) for the contiguous runs that cover [begin, end).
  template <class F>
  void for_runs(std::int64_t begin, std::int64_t end, F&& f) const {
    while (begin < end) {
      const std::int64_t block_end = (begin / kBlockRows + 1) * kBlockRows;
      const std::int64_t stop = block_end < end ? block_end : end;
      f(begin, stop - begin, row(begin));
      begin = stop;
    }
  }

 private:
  std::size_t width_ = 0;
  std::int64_t rows_ = 0;
  std::vector<std::unique_ptr<W[]>> blocks_;
};

}  // namespace kvdrive::index
