// SsdTier's metadata log (format in ssd_format.hpp): making records, laying them out in fresh
// aligned blocks for an append, and replaying the log when a store is opened, up to the first
// block that is not entirely valid (torn, unwritten or garbage, or a put whose slot lies past
// the data file's end).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/io_engine.hpp"
#include "kvdrive/tier/page_key.hpp"
#include "kvdrive/tier/ssd/layout.hpp"
#include "kvdrive/tier/ssd/store_files.hpp"
#include "kvdrive/tier/ssd_format.hpp"

namespace kvdrive::tier::ssd {

using ssd_format::LogRecord;
using ssd_format::RecordKind;

inline LogRecord make_record(RecordKind kind, const PageKey& key, std::uint64_t slot, std::uint64_t hash) {
  LogRecord r;
  r.kind = kind;
  r.seq_id = key.sequence;
  r.layer = key.layer;
  r.head = key.head;
  r.page = key.page;
  r.slot = slot;
  r.data_hash = hash;
  return r;
}

/// Numbers the records from `first`, seals each, and lays them out in zeroed blocks of `buf`;
/// returns the bytes to append (whole blocks).
inline std::size_t encode_records(std::vector<LogRecord>& records, std::uint64_t first, const Layout& l, AlignedBuffer& buf) {
  const std::size_t per_block = l.records_per_block(sizeof(LogRecord));
  const std::size_t blocks = (records.size() + per_block - 1) / per_block;
  const std::size_t len = blocks * l.align;
  std::byte* out = buf.get(len, l.align);
  std::memset(out, 0, len);
  for (std::size_t i = 0; i < records.size(); ++i) {
    records[i].sequence = first + i;
    records[i].checksum = records[i].compute_checksum();
    std::memcpy(out + (i / per_block) * l.align + (i % per_block) * sizeof(LogRecord), &records[i], sizeof records[i]);
  }
  return len;
}

/// Where a replayed log ends: the offset of its first bad block, and the next record's number.
/// Also what recovery dropped there (Decision 9 keeps nothing past the first bad block): the
/// log's bytes from that block on, the records in them that are intact on their own (their
/// checksums hold, but an earlier record or block did not), and why the log ends there.
struct LogEnd {
  std::uint64_t offset = 0;
  std::uint64_t next_sequence = 1;
  std::uint64_t replayed_records = 0;
  std::uint64_t dropped_bytes = 0;
  std::uint64_t dropped_records = 0;
  std::string why = "the end of the log";
};

/// Replays the log: hands each record of every valid block, in order, to apply(record).
template <class File, class Apply>
class LogReplay {
 public:
  LogReplay(StoreFiles<File>& files, const Layout& l, const std::string& path, Apply& apply)
      : files_(files), l_(l), path_(path), apply_(apply), reader_(files.file()) {}

  LogEnd run() {
    const std::uint64_t log_size = files_.size(files_.log(), path_ + ".log");
    data_size_ = files_.size(files_.data(), path_);
    constexpr std::size_t kChunkBlocks = 256;  // read a chunk of blocks at a time
    reader_.open(IoBackend::threads, 1, 1);
    LogEnd end{l_.align, 1};
    bool stop = false;
    while (!stop && end.offset < log_size) {
      const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(kChunkBlocks * l_.align, round_up(log_size - end.offset, l_.align)));
      std::byte* buf = buffer_.get(len, l_.align);
      IoRead r{end.offset, len, buf, 0};
      reader_.read_all(files_.log(), std::span<IoRead>(&r, 1));
      KVD_EXPECT(r.result >= 0, "{}.log: read error during recovery: {}", path_, std::strerror(static_cast<int>(-r.result)));
      const std::size_t blocks = static_cast<std::size_t>(r.result) / l_.align;
      if (blocks == 0) {
        why_ = "a short block at the log's end";
        break;
      }
      for (std::size_t b = 0; b < blocks && !stop; ++b) {
        stop = !parse_block(buf + b * l_.align, end.next_sequence);
        if (stop) break;  // torn, unwritten or garbage: the log ends before this block
        for (const LogRecord& rec : records_) apply_(rec);
        end.next_sequence += records_.size();
        end.replayed_records += records_.size();
        end.offset += l_.align;
      }
      if (!stop && blocks < len / l_.align) {
        why_ = "a short block at the log's end";
        break;
      }
    }
    if (end.offset < log_size) {
      end.why = why_;
      end.dropped_bytes = log_size - end.offset;
      end.dropped_records = count_intact(end.offset, log_size);
    }
    return end;
  }

 private:
  /// Reads one block's records into records_; false unless every record in it is valid, in
  /// sequence from `expected`, and the block holds at least one.
  bool parse_block(const std::byte* block, std::uint64_t expected) {
    records_.clear();
    const std::size_t per_block = l_.records_per_block(sizeof(LogRecord));
    for (std::size_t i = 0; i < per_block; ++i) {
      LogRecord rec;
      std::memcpy(&rec, block + i * sizeof rec, sizeof rec);
      if (rec.sequence == 0) {  // padding: the rest of the block must be zero
        for (std::size_t k = i * sizeof rec; k < l_.align; ++k)
          if (block[k] != std::byte{0}) return bad("garbage in a block's padding (a torn or damaged block)");
        break;
      }
      if (!rec.valid()) return bad("a record whose checksum fails (a torn or damaged block)");
      if (rec.sequence != expected + records_.size()) return bad("a record out of sequence (a block older than the log's end, or a lost one)");
      if (!slot_in_file(rec)) return bad("a put whose slot lies past the data file's end (its data never landed)");
      records_.push_back(rec);
    }
    return !records_.empty() || bad("an empty block (never written)");
  }

  bool bad(const char* why) {
    why_ = why;
    return false;
  }

  /// The records in [from, to) of the log whose own checksums hold (what recovery dropped
  /// intact). A read error here only leaves the count short.
  std::uint64_t count_intact(std::uint64_t from, std::uint64_t to) {
    constexpr std::size_t kChunkBlocks = 256;
    std::uint64_t intact = 0;
    const std::size_t per_block = l_.records_per_block(sizeof(LogRecord));
    for (std::uint64_t at = from; at < to;) {
      const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(kChunkBlocks * l_.align, round_up(to - at, l_.align)));
      std::byte* buf = buffer_.get(len, l_.align);
      IoRead r{at, len, buf, 0};
      reader_.read_all(files_.log(), std::span<IoRead>(&r, 1));
      if (r.result <= 0) break;
      const std::size_t blocks = static_cast<std::size_t>(r.result) / l_.align;
      for (std::size_t b = 0; b < blocks; ++b)
        for (std::size_t i = 0; i < per_block; ++i) {
          LogRecord rec;
          std::memcpy(&rec, buf + b * l_.align + i * sizeof rec, sizeof rec);
          intact += rec.sequence != 0 && rec.valid() ? 1 : 0;
        }
      if (blocks == 0 || blocks < len / l_.align) break;
      at += len;
    }
    return intact;
  }

  /// A put's data was synced before its record: its slot lies inside the data file.
  bool slot_in_file(const LogRecord& rec) const {
    return rec.kind == RecordKind::erase || (rec.kind == RecordKind::put && l_.block_of(rec.slot) < data_size_ / l_.block_bytes() &&
                                             l_.block_offset(l_.block_of(rec.slot)) + l_.block_bytes() <= data_size_);
  }

  StoreFiles<File>& files_;
  const Layout& l_;
  const std::string& path_;
  Apply& apply_;
  BasicIoEngine<File> reader_;
  std::uint64_t data_size_ = 0;
  AlignedBuffer buffer_;
  std::vector<LogRecord> records_;
  std::string why_ = "the end of the log";
};

/// Replays the log of an opened store (see LogReplay).
template <class File, class Apply>
LogEnd replay_log(StoreFiles<File>& files, const Layout& l, const std::string& path, Apply&& apply) {
  LogReplay<File, std::remove_reference_t<Apply>> replay(files, l, path, apply);
  return replay.run();
}

}  // namespace kvdrive::tier::ssd
