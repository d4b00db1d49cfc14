// tier::SsdTier: pages in one file on an SSD (or any file system), read with direct I/O
// through io_uring (or a pread thread pool where io_uring is unavailable), never returning
// wrong data (DESIGN.md Decision 9; the format is in ssd_format.hpp).
//
// - The data file is blocks of 4 KiB, flash's unit of reads (or the direct-I/O alignment,
//   statx STATX_DIOALIGN, where larger; or Params::alignment). A page of up to half a block is
//   packed, several to a block, each write batch filling fresh blocks in its order (KvManager
//   writes a stream's prompt pages cluster by cluster), so pages read together share block
//   reads; a larger page takes a slot of whole blocks, and each (sequence, layer, head) takes
//   slots an extent at a time (ssd/slots.hpp, ssd/layout.hpp). A block is written once, whole:
//   committed pages are never rewritten.
// - device_bytes_read() counts the bytes read from the device, page_bytes_read() the pages'
//   own bytes: their ratio is what packing and merging cost or save.
// - A write batch goes: data -> fdatasync -> log records -> fdatasync -> visible. An overwrite
//   goes to a fresh slot; the old one is reused only after the new record is durable. erase()
//   is durable at the next write or sync(); its slot is not reused before that
//   (ssd/write_batch.hpp).
// - Reads of adjacent slots merge into one I/O (up to max_merge_bytes); every page's xxh3 is
//   checked against the log's, so a flipped bit is an error naming the page, never wrong data
//   (ssd/read_plan.hpp).
// - open() takes the store's lock (PATH.lock, flock: one writer per store, in any process; a
//   read-only open shares it with other readers), then checks an existing store's headers
//   (magic, version, page size) and replays the log up to the first bad block: pages the log
//   calls present read back exactly (ssd/recovery.hpp, ssd/log.hpp). Files are made 0600.
// - submit() starts a batch's reads (in flight on io_uring when it returns, so several batches
//   can be read at once; the thread backend runs them in wait()); wait() finishes the batch and
//   checks it. Aligned destinations are read into directly (readv, fixed reads into registered
//   memory); others through the batch's own bounce buffer.
// - Every file operation goes through the File seam (ssd/posix_file.hpp; ssd/store_files.hpp
//   holds the files): SsdTier is BasicSsdTier<PosixFile>, and tests put a File in its place
//   that fails calls or simulates power loss (tests/fault_file.hpp). Verify is the page check
//   of read_plan.hpp (VerifyPages).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/io_engine.hpp"
#include "kvdrive/tier/ssd/layout.hpp"
#include "kvdrive/tier/ssd/log.hpp"
#include "kvdrive/tier/ssd/params.hpp"
#include "kvdrive/tier/ssd/posix_file.hpp"
#include "kvdrive/tier/ssd/read_plan.hpp"
#include "kvdrive/tier/ssd/slots.hpp"
#include "kvdrive/tier/ssd/store_files.hpp"
#include "kvdrive/tier/ssd_format.hpp"

namespace kvdrive::tier {

template <SsdFile File = PosixFile, class Verify = VerifyPages>
class BasicSsdTier {
 public:
  using Params = SsdParams;

  static constexpr bool kAddressable = false;

  explicit BasicSsdTier(Params p, File file = File()) : params_(std::move(p)), files_(std::move(file)), io_(files_.file()) {}
  // movable before open() only
  BasicSsdTier(BasicSsdTier&& o) noexcept : params_(std::move(o.params_)), files_(o.files_.file()), io_(files_.file()) {}
  BasicSsdTier(const BasicSsdTier&) = delete;
  BasicSsdTier& operator=(const BasicSsdTier&) = delete;
  ~BasicSsdTier() {
    try {
      std::lock_guard lock(mutex_);
      if (files_.is_open() && !dead_ && !params_.delete_on_close) flush_erases();
    } catch (...) {  // the erases stay undone on disk; their pages come back on reopen, intact
    }
    if (params_.delete_on_close && files_.is_open()) files_.unlink_store(params_.path);  // still under the lock
  }

  std::string_view name() const { return "ssd"; }

  /// Takes the store's lock, then makes the store or recovers it (ssd/recovery.hpp).
  void open(const TierGeometry& g);

  // ---- writes --------------------------------------------------------------------------------

  void write(const PageKey& key, const std::byte* src) {
    const WriteRequest r{key, src};
    write_batch(std::span<const WriteRequest>(&r, 1));
  }

  /// Stores the pages durably, in one data sync and one log sync. On error nothing changes:
  /// pages stored before stay readable.
  void write_batch(std::span<const WriteRequest> pages);

  /// Forgets a page now; durable at the next write or sync().
  void erase(const PageKey& key);

  /// Makes every erase so far durable.
  void sync();

  // ---- reads ---------------------------------------------------------------------------------

  /// Starts reading the batch: its reads are in flight when submit returns (io_uring), so
  /// several batches can be read at once. Throws naming the page if one is not stored (nothing
  /// is started then).
  ReadTicket submit(std::span<const ReadRequest> reads) {
    std::lock_guard lock(mutex_);
    check_open();
    ssd::ReadBatch b;
    b.reads.assign(reads.begin(), reads.end());
    if (!b.reads.empty()) plan_reads(b);
    const ReadTicket t = ++tickets_;
    try {
      batches_.emplace(t, std::move(b));  // the vectors move, their buffers (in flight) stay
    } catch (...) {
      io_.finish(b.token);
      throw;
    }
    return t;
  }

  /// Finishes the batch; throws naming the page on an I/O error, a short read or a checksum
  /// mismatch (the batch's buffers are then undefined).
  void wait(ReadTicket ticket) {
    std::lock_guard lock(mutex_);
    auto found = batches_.find(ticket);
    KVD_EXPECT(found != batches_.end(), "SsdTier {}: unknown read ticket {}", params_.path, ticket);
    ssd::ReadBatch b = std::move(found->second);
    batches_.erase(found);
    if (b.reads.empty()) return;
    io_.finish(b.token);
    check_open();
    ssd::check_reads<Verify>(b, layout_, params_.path);
  }

  // ---- inspection ----------------------------------------------------------------------------

  bool contains(const PageKey& key) const {
    std::lock_guard lock(mutex_);
    return map_.count(key) != 0;
  }
  std::size_t stored_pages() const {
    std::lock_guard lock(mutex_);
    return map_.size();
  }
  std::size_t free_pages() const {
    std::lock_guard lock(mutex_);
    if (params_.capacity_pages == 0) return std::numeric_limits<std::size_t>::max();
    return room(true);  // erased pages' slots are free once write_batch flushes them
  }
  /// The slot of a stored page (for layout tests and tools).
  std::uint64_t slot_of(const PageKey& key) const {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    KVD_EXPECT(it != map_.end(), "SsdTier {}: no page {}", params_.path, key);
    return it->second.slot;
  }
  /// What open() found in the log of an existing store: records replayed, and what it dropped
  /// from the first bad block on (bytes, records intact on their own, and why). Nothing is
  /// dropped for a new store or after a clean close.
  ssd::LogEnd recovery() const {
    std::lock_guard lock(mutex_);
    return recovery_;
  }
  std::uint64_t slot_offset(std::uint64_t slot) const { return layout_.slot_offset(slot); }
  std::size_t slot_bytes() const { return layout_.slot_bytes; }
  /// Slots in one data block: 1 unpacked, more when small pages are packed.
  std::size_t pages_per_block() const { return layout_.per_block; }
  std::size_t alignment() const { return layout_.align; }
  bool direct_io() const { return files_.direct(); }
  std::string_view io_name() const { return io_.name(); }
  const std::string& path() const { return params_.path; }
  /// Read batches run and the I/Os they took after merging.
  std::uint64_t read_batches() const {
    std::lock_guard lock(mutex_);
    return read_batches_;
  }
  std::uint64_t read_ops() const {
    std::lock_guard lock(mutex_);
    return read_ops_;
  }
  /// Bytes read from the device (whole blocks, merged runs) and the bytes of the pages read.
  std::uint64_t device_bytes_read() const {
    std::lock_guard lock(mutex_);
    return device_bytes_;
  }
  std::uint64_t page_bytes_read() const {
    std::lock_guard lock(mutex_);
    return page_bytes_;
  }
  /// Registers host memory that reads will land in (the fast tier's page pool: KvManager does
  /// it for each new block) with io_uring, once; single-page reads into it are then fixed reads.
  /// Returns false where the engine cannot (see IoEngine::register_memory); nothing changes.
  bool register_memory(std::byte* p, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    check_open();
    return io_.register_memory(p, bytes);
  }
  std::size_t registered_bytes() const {
    std::lock_guard lock(mutex_);
    return io_.registered_bytes();
  }
  /// Of read_ops(): reads into registered memory (IORING_OP_READ_FIXED).
  std::uint64_t fixed_reads() const {
    std::lock_guard lock(mutex_);
    return io_.fixed_reads();
  }

  /// Of read_ops(): reads that went straight into the callers' buffers (readv), no bounce copy.
  std::uint64_t scattered_ops() const {
    std::lock_guard lock(mutex_);
    return scattered_ops_;
  }

  /// Deletes a store's files (for tests and tools); missing files are fine. Like
  /// SsdOpen::recreate it takes the store's lock (an error names the holder) and deletes only a
  /// kvdrive store's files or empty ones. The lock file stays.
  static void remove_files(const std::string& path, File file = File()) {
    ssd::StoreFiles<File> files(std::move(file));
    files.lock(path, false);
    files.remove_store(path);
  }

 private:
  struct Entry {
    std::uint64_t slot;
    std::uint64_t hash;
  };

  std::string log_name() const { return params_.path + ".log"; }

  void check_open() const {
    KVD_EXPECT(files_.is_open(), "SsdTier {}: not open", params_.path);
    KVD_EXPECT(!dead_, "SsdTier {}: the (simulated) power went out; reopen the store", params_.path);
  }
  void check_writable() const {
    check_open();
    KVD_EXPECT(!read_only(), "SsdTier {}: opened read-only", params_.path);
  }
  bool read_only() const { return params_.mode == SsdOpen::read_only; }

  /// Looks up the batch's pages, lays out its I/Os (ssd::plan_ops) and starts them.
  void plan_reads(ssd::ReadBatch& b) {
    for (const ReadRequest& r : b.reads) {
      auto it = map_.find(r.key);
      KVD_EXPECT(it != map_.end(), "SsdTier {}: no page {}", params_.path, r.key);
      b.want.push_back({it->second.slot, it->second.hash, &r});
    }
    ssd::plan_ops(b, layout_, files_.direct(), params_.max_merge_bytes, BasicIoEngine<File>::kMaxIov);
    b.token = io_.start(files_.data(), b.ops);
    scattered_ops_ += b.scatter ? b.ops.size() : 0;
    ++read_batches_;
    read_ops_ += b.ops.size();
    device_bytes_ += ssd::device_bytes(b);
    page_bytes_ += b.want.size() * layout_.page_bytes;
  }

  // ---- the write path (ssd/write_batch.hpp) -----------------------------------------------

  void check_distinct(std::span<const WriteRequest> pages) const;
  std::size_t room(bool with_deferred) const;
  std::vector<std::uint64_t> take_slots(std::span<const WriteRequest> pages);
  void write_data(std::span<const WriteRequest> pages, const std::vector<std::uint64_t>& slots);
  void make_visible(std::span<const WriteRequest> pages, const std::vector<std::uint64_t>& slots, const std::vector<std::uint64_t>& hashes);
  void append_log(std::vector<ssd_format::LogRecord>& records);
  void roll_back_log() noexcept;
  void flush_erases();

  // ---- opening a store (ssd/recovery.hpp) -------------------------------------------------

  bool creation_cut_short();
  void create();
  void recover();
  void read_headers();
  void apply(const ssd_format::LogRecord& rec);

  Params params_;
  mutable std::mutex mutex_;
  ssd::StoreFiles<File> files_;
  ssd::Layout layout_;
  std::uint64_t log_end_ = 0, next_sequence_ = 1;
  ssd::LogEnd recovery_;
  std::unordered_map<PageKey, Entry, PageKeyHash> map_;
  ssd::Slots slots_;
  std::vector<ssd_format::LogRecord> pending_erases_;
  std::map<ReadTicket, ssd::ReadBatch> batches_;  ///< submitted, not yet waited for (their reads may be in flight)
  ReadTicket tickets_ = 0;
  ssd::AlignedBuffer bounce_;  ///< the write path's
  std::uint64_t read_batches_ = 0, read_ops_ = 0, scattered_ops_ = 0, device_bytes_ = 0, page_bytes_ = 0;
  bool dead_ = false;  ///< a failed write could not be rolled back: every call fails
  /// Last: gone first, its reads in flight drained, before the batches' buffers and the files.
  BasicIoEngine<File> io_;
};

using SsdTier = BasicSsdTier<PosixFile>;
static_assert(StorageTier<SsdTier>);

}  // namespace kvdrive::tier

// BasicSsdTier's members defined outside the class, one header per purpose.
#include "kvdrive/tier/ssd/recovery.hpp"
#include "kvdrive/tier/ssd/write_batch.hpp"
