// SsdTier's geometry and its aligned memory: where slot i lies in the data file (after the
// header block, slot_bytes apart), and buffers aligned for direct I/O (the write path's bounce
// buffer, a read batch's own one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "kvdrive/core/error.hpp"

namespace kvdrive::tier::ssd {

inline std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

/// The store's geometry: page size, slot size (the page rounded up to the alignment) and the
/// direct-I/O alignment, which is also the size of a header block and of a log block.
struct Layout {
  std::size_t page_bytes = 0, slot_bytes = 0, align = 4096;

  std::uint64_t slot_offset(std::uint64_t slot) const { return align + slot * slot_bytes; }
  /// Log records that fit in one log block.
  std::size_t records_per_block(std::size_t record_bytes) const { return align / record_bytes; }
};

/// Memory aligned for direct I/O, grown on demand (what it held does not survive growing).
class AlignedBuffer {
 public:
  /// At least `bytes` (rounded up to `align`); the memory it has when that is enough.
  std::byte* get(std::size_t bytes, std::size_t align) {
    if (bytes > size_) {
      void* p = nullptr;
      KVD_EXPECT(::posix_memalign(&p, align, round_up(bytes, align)) == 0, "SsdTier: cannot allocate {} bytes", bytes);
      mem_.reset(static_cast<std::byte*>(p));
      size_ = round_up(bytes, align);
    }
    return mem_.get();
  }
  std::byte* data() const { return mem_.get(); }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> mem_;
  std::size_t size_ = 0;
};

}  // namespace kvdrive::tier::ssd
