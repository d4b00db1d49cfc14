// SsdTier's geometry and its aligned memory: where slot i lies in the data file, and buffers
// aligned for direct I/O (the write path's bounce buffer, a read batch's own one).
//
// The data file is the header block, then data blocks. A page of more than half the alignment
// takes a block (a slot) of its own, page_bytes rounded up to the alignment. Smaller pages are
// packed: slots of page_bytes rounded up to 16, alignment / slot_bytes of them in each
// alignment-sized block, so that a read of one block brings several pages (ssd_format.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "kvdrive/core/error.hpp"

namespace kvdrive::tier::ssd {

inline std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

/// The store's geometry: page size, slot size, slots per data block and the direct-I/O
/// alignment, which is also the size of a header block and of a log block.
struct Layout {
  static constexpr std::size_t kPackedSlotGrain = 16;
  static constexpr std::size_t kMinBlockBytes = 4096;  ///< a new store's blocks, unless Params::alignment says otherwise

  std::size_t page_bytes = 0, slot_bytes = 0, align = 4096;
  std::size_t per_block = 1;  ///< slots in one data block (1: unpacked)

  /// The slot size of a new store: packed slots where two or more fit a block (and `pack`).
  static std::size_t slot_size(std::size_t page_bytes, std::size_t align, bool pack) {
    const std::size_t packed = round_up(page_bytes, kPackedSlotGrain);
    return pack && 2 * packed <= align ? packed : round_up(page_bytes, align);
  }
  /// Sets the slot size (a new store's, or the one a header holds) and what follows from it.
  void set_slot_bytes(std::size_t bytes) {
    slot_bytes = bytes;
    per_block = bytes < align ? align / bytes : 1;
  }
  /// Whether a header's slot size is one this layout can hold pages of page_bytes in.
  bool valid_slot_bytes(std::size_t bytes) const {
    if (bytes < page_bytes || bytes == 0) return false;
    return bytes % align == 0 || (bytes % kPackedSlotGrain == 0 && 2 * bytes <= align);
  }

  bool packed() const { return per_block > 1; }
  /// Bytes of one data block: the unit of every read and write of the data file.
  std::size_t block_bytes() const { return packed() ? align : slot_bytes; }
  std::uint64_t block_of(std::uint64_t slot) const { return slot / per_block; }
  std::uint64_t block_offset(std::uint64_t block) const { return align + block * block_bytes(); }
  /// Where slot `slot` starts inside its block.
  std::size_t offset_in_block(std::uint64_t slot) const { return static_cast<std::size_t>(slot % per_block) * slot_bytes; }
  std::uint64_t slot_offset(std::uint64_t slot) const { return block_offset(block_of(slot)) + offset_in_block(slot); }
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
