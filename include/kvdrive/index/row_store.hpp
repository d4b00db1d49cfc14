// RowStore: fixed-width rows of float appended one page at a time, kept in blocks of kBlockRows
// rows so that growing never moves (or re-faults) what is already stored. Indices use it for
// their per-page data: a decode step that seals a page must not copy the whole index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvdrive::index {

class RowStore {
 public:
  static constexpr std::int64_t kBlockRows = 1024;

  RowStore() = default;
  explicit RowStore(std::size_t width) : width_(width) {}

  std::size_t width() const { return width_; }
  std::int64_t rows() const { return rows_; }
  std::size_t bytes() const { return static_cast<std::size_t>(rows_) * width_ * sizeof(float); }

  /// Appends one row of width() floats.
  void push(const float* row) {
    if (rows_ % kBlockRows == 0) blocks_.emplace_back().reserve(static_cast<std::size_t>(kBlockRows) * width_);
    blocks_.back().insert(blocks_.back().end(), row, row + width_);
    ++rows_;
  }

  const float* row(std::int64_t i) const {
    return blocks_[static_cast<std::size_t>(i / kBlockRows)].data() + static_cast<std::size_t>(i % kBlockRows) * width_;
  }

 private:
  std::size_t width_ = 0;
  std::int64_t rows_ = 0;
  std::vector<std::vector<float>> blocks_;
};

}  // namespace kvdrive::index
