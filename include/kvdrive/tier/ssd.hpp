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
//   is durable at the next write or sync(); its slot is not reused before that.
// - Reads of adjacent slots merge into one I/O (up to max_merge_bytes); every page's xxh3 is
//   checked against the log's, so a flipped bit is an error naming the page, never wrong data
//   (ssd/read_plan.hpp).
// - open() takes the store's lock (PATH.lock, flock: one writer per store, in any process; a
//   read-only open shares it with other readers), then checks an existing store's headers
//   (magic, version, page size) and replays the log up to the first bad block: pages the log
//   calls present read back exactly (ssd/log.hpp). Files are made 0600.
// - submit() starts a batch's reads (in flight on io_uring when it returns, so several batches
//   can be read at once; the thread backend runs them in wait()); wait() finishes the batch and
//   checks it. Aligned destinations are read into directly (readv, fixed reads into registered
//   memory); others through the batch's own bounce buffer.
// - Every file operation goes through the File seam (ssd/posix_file.hpp; ssd/store_files.hpp
//   holds the files): SsdTier is BasicSsdTier<PosixFile>, and tests put a File in its place
//   that fails calls or simulates power loss (tests/fault_file.hpp). Verify is the page check
//   of read_plan.hpp (VerifyPages).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/io_engine.hpp"
#include "kvdrive/tier/ssd/layout.hpp"
#include "kvdrive/tier/ssd/log.hpp"
#include "kvdrive/tier/ssd/posix_file.hpp"
#include "kvdrive/tier/ssd/read_plan.hpp"
#include "kvdrive/tier/ssd/slots.hpp"
#include "kvdrive/tier/ssd/store_files.hpp"
#include "kvdrive/tier/ssd_format.hpp"

namespace kvdrive::tier {

/// How SsdTier::open treats the files at its path. Every mode takes the store's lock first
/// (PATH.lock): one writer per store, in this process or any other.
enum class SsdOpen {
  open_or_create,  ///< reopen the store there (recovering its pages), or make one
  recreate,        ///< delete the store there (only if its files are a kvdrive store's, or empty), then make one
  read_only,       ///< inspect an existing store: its pages read back; writes, erases and syncs are refused
};

/// SsdTier::Params (one type for every BasicSsdTier).
struct SsdParams {
  std::string path;                           ///< the data file (made if missing); the log is PATH.log, the lock PATH.lock
  SsdOpen mode = SsdOpen::open_or_create;
  bool delete_on_close = false;               ///< a scratch store: its data file and log go when the tier does
  std::size_t capacity_pages = 0;             ///< 0: grows until the disk is full
  std::size_t alignment = 0;                  ///< blocks of a new store; 0: 4096, or the device's direct-I/O alignment (statx STATX_DIOALIGN) if larger
  unsigned queue_depth = 64;                  ///< reads in flight
  std::size_t max_merge_bytes = 256u << 10;   ///< the largest merged read of adjacent slots
  std::size_t extent_pages = 64;              ///< slots a stream takes at a time (pages not packed)
  bool pack_pages = true;                     ///< a new store packs pages of up to half a block several to a block
  IoBackend io = IoBackend::automatic;
  bool direct_io = true;                      ///< O_DIRECT where the file system allows it
};

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

  void open(const TierGeometry& g) {
    std::lock_guard lock(mutex_);
    KVD_EXPECT(!files_.is_open(), "SsdTier {}: already open", params_.path);
    KVD_EXPECT(!params_.path.empty(), "SsdTier: no path given");
    KVD_EXPECT(g.page_bytes > 0, "SsdTier: page size 0");
    KVD_EXPECT(params_.extent_pages >= 1 && params_.max_merge_bytes >= 1, "SsdTier {}: extent_pages and max_merge_bytes must be >= 1",
               params_.path);
    layout_.page_bytes = g.page_bytes;
    try {
      files_.lock(params_.path, read_only());
      if (params_.mode == SsdOpen::recreate) files_.remove_store(params_.path);
      const bool exists = files_.exists(params_.path);
      KVD_EXPECT(!exists || files_.is_store_or_empty(params_.path), "{} is not a kvdrive store (bad header)", params_.path);  // before the log is made beside it
      KVD_EXPECT(!read_only() || (exists && files_.exists(log_name())), "SsdTier {}: no store there to open read-only", params_.path);
      files_.open(params_.path, exists, exists && files_.exists(log_name()), params_.direct_io, read_only());
      layout_.align = params_.alignment ? params_.alignment : files_.dio_alignment();
      KVD_EXPECT(layout_.align >= 512 && (layout_.align & (layout_.align - 1)) == 0,
                 "SsdTier {}: alignment {} is not a power of two >= 512", params_.path, layout_.align);
      if (exists && !creation_cut_short())
        recover();
      else
        create();
      slots_.configure(params_.capacity_pages, params_.extent_pages, layout_.per_block);
      slots_.rebuild(map_);
      io_.open(params_.io, params_.queue_depth, 0);
    } catch (...) {  // nothing half-open stays behind, the lock included
      files_.close();
      map_.clear();
      throw;
    }
  }

  // ---- writes --------------------------------------------------------------------------------

  void write(const PageKey& key, const std::byte* src) {
    const WriteRequest r{key, src};
    write_batch(std::span<const WriteRequest>(&r, 1));
  }

  /// Stores the pages durably, in one data sync and one log sync. On error nothing changes:
  /// pages stored before stay readable.
  void write_batch(std::span<const WriteRequest> pages) {
    std::lock_guard lock(mutex_);
    check_writable();
    if (pages.empty()) return;
    check_distinct(pages);
    // Erased pages' slots become usable once their records are durable: flush them first when
    // the store needs the room.
    if (!pending_erases_.empty() && params_.capacity_pages && pages.size() > room(false)) flush_erases();
    // Slots first (all or nothing), then data, sync, log, sync.
    const std::vector<std::uint64_t> slots = take_slots(pages);
    std::vector<std::uint64_t> hashes(pages.size());
    for (std::size_t i = 0; i < pages.size(); ++i) hashes[i] = ssd_format::page_hash(pages[i].src, layout_.page_bytes);
    try {
      write_data(pages, slots);
      files_.datasync(files_.data(), params_.path);
      // The log: pending erases first, then the puts.
      std::vector<ssd_format::LogRecord> records = pending_erases_;
      for (std::size_t i = 0; i < pages.size(); ++i)
        records.push_back(ssd::make_record(ssd_format::RecordKind::put, pages[i].key, slots[i], hashes[i]));
      append_log(records);
    } catch (...) {
      roll_back_log();
      slots_.free(slots);
      throw;
    }
    make_visible(pages, slots, hashes);
  }

  /// Forgets a page now; durable at the next write or sync().
  void erase(const PageKey& key) {
    std::lock_guard lock(mutex_);
    check_writable();
    auto it = map_.find(key);
    if (it == map_.end()) return;
    pending_erases_.push_back(ssd::make_record(ssd_format::RecordKind::erase, key, it->second.slot, 0));
    pending_erases_.back().sequence = 0;  // numbered when written
    slots_.defer(it->second.slot);
    map_.erase(it);
  }

  /// Makes every erase so far durable.
  void sync() {
    std::lock_guard lock(mutex_);
    check_writable();
    flush_erases();
  }

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

  void check_distinct(std::span<const WriteRequest> pages) const {
    std::vector<PageKey> keys;
    keys.reserve(pages.size());
    for (const WriteRequest& r : pages) keys.push_back(r.key);
    const auto less = [](const PageKey& a, const PageKey& b) {
      return std::tie(a.sequence, a.layer, a.head, a.page) < std::tie(b.sequence, b.layer, b.head, b.page);
    };
    std::sort(keys.begin(), keys.end(), less);
    const auto twice = std::adjacent_find(keys.begin(), keys.end());
    KVD_EXPECT(twice == keys.end(), "SsdTier {}: page {} twice in one write batch", params_.path, *twice);
  }

  /// Pages that fit (packed: in whole free blocks), counting the slots of erases not yet durable
  /// as free or not. Only with a capacity.
  std::size_t room(bool with_deferred) const {
    const std::size_t held = map_.size() + (with_deferred ? 0 : pending_erases_.size());
    const std::size_t left = params_.capacity_pages - std::min(params_.capacity_pages, held);
    return layout_.packed() ? std::min(left, slots_.free_pages(with_deferred)) : left;
  }

  /// A slot for every page, in the batch's order (packed: filling fresh blocks), or none (the
  /// store is full: throws naming the first page that does not fit).
  std::vector<std::uint64_t> take_slots(std::span<const WriteRequest> pages) {
    std::vector<PageKey> keys;
    keys.reserve(pages.size());
    for (const WriteRequest& r : pages) keys.push_back(r.key);
    std::optional<std::vector<std::uint64_t>> slots = slots_.take(keys);
    if (!slots) {
      const std::size_t fits = std::min(room(false), pages.size() - 1);
      fail("SsdTier {}: full ({} pages); page {} does not fit", params_.path, params_.capacity_pages, pages[fits].key);
    }
    return std::move(*slots);
  }

  /// Writes the pages into their slots, each run of adjacent blocks as one write of whole
  /// blocks (the blocks are fresh: slots a batch leaves unused are zeros).
  void write_data(std::span<const WriteRequest> pages, const std::vector<std::uint64_t>& slots) {
    std::vector<std::size_t> order(pages.size());
    for (std::size_t i = 0; i < pages.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return slots[a] < slots[b]; });
    const ssd::Layout& l = layout_;
    const std::size_t bb = l.block_bytes();
    for (std::size_t i = 0; i < order.size();) {
      const std::uint64_t first = l.block_of(slots[order[i]]);
      std::uint64_t last = first;
      std::size_t j = i + 1;
      for (; j < order.size(); ++j) {
        const std::uint64_t next = l.block_of(slots[order[j]]);
        if (next != last && (next != last + 1 || (next - first + 1) * bb > params_.max_merge_bytes)) break;
        last = next;
      }
      const std::size_t len = static_cast<std::size_t>(last - first + 1) * bb;
      std::byte* buf = bounce_.get(len, l.align);
      std::memset(buf, 0, len);
      for (std::size_t k = i; k < j; ++k) {
        const std::uint64_t s = slots[order[k]];
        std::memcpy(buf + (l.block_of(s) - first) * bb + l.offset_in_block(s), pages[order[k]].src, l.page_bytes);
      }
      files_.write_all(files_.data(), buf, len, l.block_offset(first), params_.path, pages[order[i]].key);
      i = j;
    }
  }

  /// The batch is durable: its pages become visible, and the slots it replaced or that erases
  /// freed are durable garbage now, to be reused.
  void make_visible(std::span<const WriteRequest> pages, const std::vector<std::uint64_t>& slots, const std::vector<std::uint64_t>& hashes) {
    next_sequence_ += pending_erases_.size() + pages.size();
    pending_erases_.clear();
    slots_.free_deferred();
    std::vector<std::uint64_t> replaced;
    for (std::size_t i = 0; i < pages.size(); ++i) {
      auto [it, fresh] = map_.try_emplace(pages[i].key, Entry{slots[i], hashes[i]});
      if (!fresh) {
        replaced.push_back(it->second.slot);
        it->second = Entry{slots[i], hashes[i]};
      }
    }
    slots_.free(replaced);
  }

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

  /// A store whose making was cut short (killed between making the files and syncing the log's
  /// header): the log is empty, so no page was ever committed (open() has checked that the data
  /// file is empty or has a kvdrive header). create() finishes it. Anything else is for recover()
  /// to accept or refuse.
  bool creation_cut_short() {
    if (files_.size(files_.log(), log_name()) != 0) return false;
    KVD_EXPECT(!read_only(), "SsdTier {}: a store whose making was cut short (an empty log); open it for writing once to finish it",
               params_.path);
    recovery_.why = "a store whose making was cut short (an empty log): made again";
    return true;
  }

  /// A new store: both headers, then the directory entries. Its blocks are at least 4 KiB,
  /// flash's unit of reads, even where direct I/O allows less (Params::alignment sets them).
  void create() {
    if (params_.alignment == 0) layout_.align = std::max(layout_.align, ssd::Layout::kMinBlockBytes);
    layout_.set_slot_bytes(ssd::Layout::slot_size(layout_.page_bytes, layout_.align, params_.pack_pages));
    files_.write_header(files_.data(), ssd_format::kDataMagic, layout_, params_.path);
    files_.write_header(files_.log(), ssd_format::kLogMagic, layout_, log_name());
    log_end_ = layout_.align;
    files_.sync_directory(params_.path);
  }

  /// An existing store: its headers, the log replayed (then cut at its end, so that blocks past
  /// a torn one can never be replayed later), and the free slots.
  void recover() {
    read_headers();
    const ssd::LogEnd end = ssd::replay_log(files_, layout_, params_.path, [&](const ssd_format::LogRecord& rec) { apply(rec); });
    recovery_ = end;
    log_end_ = end.offset;
    next_sequence_ = end.next_sequence;
    if (!read_only())  // a read-only open leaves the log as it is
      KVD_EXPECT(files_.cut(files_.log(), log_end_), "{}.log: cannot cut the log after recovery: {}", params_.path, std::strerror(errno));
  }

  void read_headers() {
    const ssd_format::Header dh = files_.read_header(files_.data(), ssd_format::kDataMagic, layout_.align, layout_.page_bytes, params_.path);
    // The store's own alignment lays out its slots; the device's must divide it.
    KVD_EXPECT(dh.alignment >= 512 && (dh.alignment & (dh.alignment - 1)) == 0 && dh.alignment % layout_.align == 0,
               "{}: made with {}-byte alignment, but this device needs {}", params_.path, dh.alignment, layout_.align);
    layout_.align = dh.alignment;
    const ssd_format::Header lh = files_.read_header(files_.log(), ssd_format::kLogMagic, layout_.align, layout_.page_bytes, log_name());
    KVD_EXPECT(lh.slot_bytes == dh.slot_bytes && lh.alignment == dh.alignment, "{}: data and log headers disagree", params_.path);
    KVD_EXPECT(layout_.valid_slot_bytes(dh.slot_bytes) && (dh.version >= 2 || dh.slot_bytes % dh.alignment == 0),
               "{}: bad slot size {}", params_.path, dh.slot_bytes);
    layout_.set_slot_bytes(dh.slot_bytes);
  }

  void apply(const ssd_format::LogRecord& rec) {
    if (rec.kind == ssd_format::RecordKind::put)
      map_[rec.key()] = Entry{rec.slot, rec.data_hash};
    else
      map_.erase(rec.key());
  }

  /// Numbers the records from next_sequence_, writes them in fresh blocks and syncs. Does not
  /// advance next_sequence_ (the caller does once the batch is visible).
  void append_log(std::vector<ssd_format::LogRecord>& records) {
    const std::size_t len = ssd::encode_records(records, next_sequence_, layout_, bounce_);
    files_.write_all(files_.log(), bounce_.data(), len, log_end_, log_name(), records.front().key());
    files_.datasync(files_.log(), log_name());
    log_end_ += len;
  }

  /// After a failed append: cut the log back to its last committed block, so that a record
  /// that may have landed cannot point at slots handed out again. If even that fails, the
  /// store refuses further calls (reopen it).
  void roll_back_log() noexcept {
    if (dead_) return;
    try {
      dead_ = !files_.cut(files_.log(), log_end_);
    } catch (...) {  // a File that throws (a test's simulated power loss)
      dead_ = true;
    }
  }

  void flush_erases() {
    if (pending_erases_.empty()) return;
    try {
      append_log(pending_erases_);
    } catch (...) {
      roll_back_log();
      throw;
    }
    next_sequence_ += pending_erases_.size();
    pending_erases_.clear();
    slots_.free_deferred();
  }

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
