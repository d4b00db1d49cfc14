// The on-disk format of SsdTier (Decision 9). Two files:
//   PATH      the data file: one header block, then the data blocks. A page of more than half
//             the alignment takes a slot of its own (page_bytes rounded up to the alignment;
//             slot i at alignment + i x slot_bytes). Smaller pages are packed (version 2):
//             slot_bytes is page_bytes rounded up to 16 and below the alignment, and each block
//             of `alignment` bytes holds alignment / slot_bytes slots; slot i lies in block
//             i / per_block at (i % per_block) x slot_bytes. A block is written once, whole.
//   PATH.log  the metadata log: one header block, then record blocks. Each append writes fresh
//             aligned blocks (a committed block is never rewritten), holding LogRecords: a
//             sequence number (1, 2, ... with no gap), what happened (put or erase), the page's
//             key, its slot, the xxh3 of its bytes, and the record's own checksum.
// Recovery replays records in order and stops at the first bad one (a torn or unwritten block).
// Every field is little-endian, fixed size; the version changes with any change of layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvdrive/core/xxhash.hpp"
#include "kvdrive/tier/page_key.hpp"

namespace kvdrive::tier::ssd_format {

inline constexpr char kDataMagic[8] = {'K', 'V', 'D', 'S', 'S', 'D', 'D', '1'};
inline constexpr char kLogMagic[8] = {'K', 'V', 'D', 'S', 'S', 'D', 'L', '1'};
inline constexpr std::uint32_t kVersion = 2;        ///< what this build writes
inline constexpr std::uint32_t kOldestVersion = 1;  ///< version 1: slots only, never packed

/// The first block of both files.
struct Header {
  char magic[8] = {};
  std::uint32_t version = kVersion;
  std::uint32_t alignment = 0;  ///< direct-I/O alignment the store was made with
  std::uint64_t page_bytes = 0;
  std::uint64_t slot_bytes = 0;
  std::uint64_t checksum = 0;  ///< xxh3 of the fields above

  std::uint64_t compute_checksum() const { return XXH3_64bits(this, offsetof(Header, checksum)); }
};
static_assert(sizeof(Header) == 40);

enum class RecordKind : std::uint32_t { put = 1, erase = 2 };

struct LogRecord {
  std::uint64_t sequence = 0;  ///< 1, 2, 3, ... (0: no record)
  RecordKind kind = RecordKind::put;
  std::uint32_t layer = 0;
  std::uint64_t seq_id = 0;  ///< the page's sequence (PageKey::sequence)
  std::uint32_t head = 0;
  std::uint32_t page = 0;
  std::uint64_t slot = 0;
  std::uint64_t data_hash = 0;  ///< xxh3 of the page's page_bytes
  std::uint64_t checksum = 0;   ///< xxh3 of the fields above

  PageKey key() const { return PageKey{seq_id, layer, head, page}; }
  std::uint64_t compute_checksum() const { return XXH3_64bits(this, offsetof(LogRecord, checksum)); }
  bool valid() const { return sequence != 0 && checksum == compute_checksum(); }
};
static_assert(sizeof(LogRecord) == 56);

inline std::uint64_t page_hash(const std::byte* page, std::size_t page_bytes) { return XXH3_64bits(page, page_bytes); }

}  // namespace kvdrive::tier::ssd_format
