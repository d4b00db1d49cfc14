// tier::SsdTier: pages in one file on an SSD (or any file system), read with direct I/O
// through io_uring (or a pread thread pool where io_uring is unavailable), never returning
// wrong data (DESIGN.md Decision 9; the format is in ssd_format.hpp).
//
// - Slots are page_bytes rounded up to the direct-I/O alignment (statx STATX_DIOALIGN, else
//   4096, or Params::alignment). Each (sequence, layer, head) takes slots an extent at a time,
//   so a stream's pages sit together, in the order they are written.
// - A write batch goes: data -> fdatasync -> log records -> fdatasync -> visible. An overwrite
//   goes to a fresh slot; the old one is reused only after the new record is durable. erase()
//   is durable at the next write or sync(); its slot is not reused before that.
// - Reads of adjacent slots merge into one I/O (up to max_merge_bytes); every page's xxh3 is
//   checked against the log's, so a flipped bit is an error naming the page, never wrong data.
// - open() of an existing store checks its headers (magic, version, page size) and replays the
//   log up to the first bad block: pages the log calls present read back exactly.
// - submit() starts a batch's reads (in flight on io_uring when it returns, so several batches
//   can be read at once; the thread backend runs them in wait()); wait() finishes the batch and
//   checks it. Aligned destinations are read into directly (readv, fixed reads into registered
//   memory); others through the batch's own bounce buffer.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <tuple>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
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
#include "kvdrive/tier/ssd_format.hpp"

namespace kvdrive::tier {

class SsdTier {
 public:
  struct Params {
    std::string path;                           ///< the data file (made if missing); the log is PATH.log
    std::size_t capacity_pages = 0;             ///< 0: grows until the disk is full
    std::size_t alignment = 0;                  ///< 0: statx STATX_DIOALIGN, else 4096
    unsigned queue_depth = 64;                  ///< reads in flight
    std::size_t max_merge_bytes = 256u << 10;   ///< the largest merged read of adjacent slots
    std::size_t extent_pages = 64;              ///< slots a stream takes at a time
    IoBackend io = IoBackend::automatic;
    bool direct_io = true;                      ///< O_DIRECT where the file system allows it
  };

  static constexpr bool kAddressable = false;

  explicit SsdTier(Params p) : params_(std::move(p)) {}
  SsdTier(SsdTier&& o) noexcept : params_(std::move(o.params_)) {}  // movable before open() only
  SsdTier(const SsdTier&) = delete;
  SsdTier& operator=(const SsdTier&) = delete;
  ~SsdTier() {
    try {
      std::lock_guard lock(mutex_);
      if (data_fd_ >= 0 && !dead_) flush_erases();
    } catch (...) {  // the erases stay undone on disk; their pages come back on reopen, intact
    }
    for (int fd : {data_fd_, log_fd_, data_buffered_, log_buffered_})
      if (fd >= 0) ::close(fd);
  }

  std::string_view name() const { return "ssd"; }

  void open(const TierGeometry& g) {
    std::lock_guard lock(mutex_);
    KVD_EXPECT(data_fd_ < 0, "SsdTier {}: already open", params_.path);
    KVD_EXPECT(!params_.path.empty(), "SsdTier: no path given");
    KVD_EXPECT(g.page_bytes > 0, "SsdTier: page size 0");
    KVD_EXPECT(params_.extent_pages >= 1 && params_.max_merge_bytes >= 1, "SsdTier {}: extent_pages and max_merge_bytes must be >= 1",
               params_.path);
    page_bytes_ = g.page_bytes;
    const bool exists = ::access(params_.path.c_str(), F_OK) == 0;
    data_fd_ = open_file(params_.path, exists);
    log_fd_ = open_file(params_.path + ".log", exists && ::access((params_.path + ".log").c_str(), F_OK) == 0);
    align_ = params_.alignment ? params_.alignment : dio_alignment(data_fd_);
    KVD_EXPECT(align_ >= 512 && (align_ & (align_ - 1)) == 0, "SsdTier {}: alignment {} is not a power of two >= 512", params_.path,
               align_);
    if (exists) {
      recover();
    } else {
      slot_bytes_ = round_up(page_bytes_, align_);
      write_header(data_fd_, ssd_format::kDataMagic, params_.path);
      write_header(log_fd_, ssd_format::kLogMagic, params_.path + ".log");
      log_end_ = align_;
      sync_directory();
    }
    io_.open(params_.io, params_.queue_depth, 0);
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
    check_open();
    if (pages.empty()) return;
    {
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
    // Erased pages' slots become usable once their records are durable: flush them first when
    // the store needs the room.
    if (!pending_free_.empty() && params_.capacity_pages && map_.size() + pending_free_.size() + pages.size() > params_.capacity_pages)
      flush_erases();
    // Slots first (all or nothing), then data, sync, log, sync.
    std::vector<std::uint64_t> slots;
    const auto give_back = [&] {
      for (std::uint64_t s : slots) free_slots_.push_back(s);
      order_free_slots();
    };
    try {
      for (const WriteRequest& r : pages) slots.push_back(allocate_slot(r.key));
    } catch (...) {
      give_back();
      throw;
    }
    std::vector<std::uint64_t> hashes(pages.size());
    std::vector<std::size_t> order(pages.size());
    for (std::size_t i = 0; i < pages.size(); ++i) {
      order[i] = i;
      hashes[i] = ssd_format::page_hash(pages[i].src, page_bytes_);
    }
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return slots[a] < slots[b]; });
    try {
      // Runs of adjacent slots go out as one write each.
      for (std::size_t i = 0; i < order.size();) {
        std::size_t j = i + 1;
        while (j < order.size() && slots[order[j]] == slots[order[j - 1]] + 1 && (j - i + 1) * slot_bytes_ <= params_.max_merge_bytes) ++j;
        const std::size_t len = (j - i) * slot_bytes_;
        std::byte* buf = bounce(len);
        std::memset(buf, 0, len);
        for (std::size_t k = i; k < j; ++k) std::memcpy(buf + (k - i) * slot_bytes_, pages[order[k]].src, page_bytes_);
        pwrite_all(data_fd_, buf, len, slot_offset(slots[order[i]]), params_.path, pages[order[i]].key);
        i = j;
      }
      sync(data_fd_, params_.path);
      // The log: pending erases first, then the puts.
      std::vector<ssd_format::LogRecord> records = pending_erases_;
      for (std::size_t i = 0; i < pages.size(); ++i) records.push_back(make_record(ssd_format::RecordKind::put, pages[i].key, slots[i], hashes[i]));
      append_log(records);
    } catch (...) {
      roll_back_log();
      give_back();
      throw;
    }
    // Visible. Replaced slots and erased ones are durable garbage now: reuse them.
    next_sequence_ += pending_erases_.size() + pages.size();
    pending_erases_.clear();
    for (std::uint64_t s : pending_free_) free_slots_.push_back(s);
    pending_free_.clear();
    for (std::size_t i = 0; i < pages.size(); ++i) {
      auto [it, fresh] = map_.try_emplace(pages[i].key, Entry{slots[i], hashes[i]});
      if (!fresh) {
        free_slots_.push_back(it->second.slot);
        it->second = Entry{slots[i], hashes[i]};
      }
    }
    order_free_slots();
  }

  /// Forgets a page now; durable at the next write or sync().
  void erase(const PageKey& key) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return;
    pending_erases_.push_back(make_record(ssd_format::RecordKind::erase, key, it->second.slot, 0));
    pending_erases_.back().sequence = 0;  // numbered when written
    pending_free_.push_back(it->second.slot);
    map_.erase(it);
  }

  /// Makes every erase so far durable.
  void sync() {
    std::lock_guard lock(mutex_);
    check_open();
    flush_erases();
  }

  // ---- reads ---------------------------------------------------------------------------------

  /// Starts reading the batch: its reads are in flight when submit returns (io_uring), so
  /// several batches can be read at once. Throws naming the page if one is not stored (nothing
  /// is started then).
  ReadTicket submit(std::span<const ReadRequest> reads) {
    std::lock_guard lock(mutex_);
    check_open();
    ReadBatch b;
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
    ReadBatch b = std::move(found->second);
    batches_.erase(found);
    if (b.reads.empty()) return;
    io_.finish(b.token);
    check_open();
    for (std::size_t o = 0; o < b.ops.size(); ++o) {
      const IoRead& op = b.ops[o];
      const Want& w0 = b.want[b.first[o]];
      KVD_EXPECT(op.result >= 0, "SsdTier {}: read error on page {} (slot {}): {}", params_.path, w0.req->key, w0.slot,
                 std::strerror(static_cast<int>(-op.result)));
      KVD_EXPECT(static_cast<std::size_t>(op.result) == op.len, "SsdTier {}: short read of page {} (slot {}): {} of {} bytes",
                 params_.path, w0.req->key, w0.slot, op.result, op.len);
      const std::size_t pages_in_op = op.len / slot_bytes_;
      for (std::size_t k = 0; k < pages_in_op; ++k) {
        const Want& w = b.want[b.first[o] + k];
        const std::byte* src = b.scatter ? w.req->dst : op.buf + k * slot_bytes_;
#ifndef KVD_SSD_MUTATE_NO_VERIFY  // the durability tests' mutation check: this build must fail them
        const std::uint64_t h = ssd_format::page_hash(src, page_bytes_);
        KVD_EXPECT(h == w.hash, "SsdTier {}: checksum mismatch on page {} (slot {}): stored xxh3 {:016x}, read {:016x}",
                   params_.path, w.req->key, w.slot, w.hash, h);
#endif
        if (!b.scatter) std::memcpy(w.req->dst, src, page_bytes_);
      }
    }
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
    const std::size_t held = map_.size();  // erased pages' slots are free once write_batch flushes them
    return held < params_.capacity_pages ? params_.capacity_pages - held : 0;
  }
  /// The slot of a stored page (for layout tests and tools).
  std::uint64_t slot_of(const PageKey& key) const {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    KVD_EXPECT(it != map_.end(), "SsdTier {}: no page {}", params_.path, key);
    return it->second.slot;
  }
  std::uint64_t slot_offset(std::uint64_t slot) const { return align_ + slot * slot_bytes_; }
  std::size_t slot_bytes() const { return slot_bytes_; }
  std::size_t alignment() const { return align_; }
  bool direct_io() const { return direct_; }
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

  /// Tests: the power goes at the n-th write or sync from now (n >= 1): writes not yet synced
  /// are lost, the last of them torn; that call throws and the tier is dead (reopen the store).
  void simulate_power_loss_after(std::uint64_t n) {
    std::lock_guard lock(mutex_);
    check_open();
    KVD_EXPECT(n >= 1, "simulate_power_loss_after: n must be >= 1");
    power_.armed = true;
    power_.countdown = n;
    power_.unsynced.clear();
  }

  /// Tests: flips one bit of a stored page in the file (below the checksum), as a failing
  /// medium would.
  void flip_stored_bit(const PageKey& key, std::size_t bit) {
    std::lock_guard lock(mutex_);
    check_open();
    auto it = map_.find(key);
    KVD_EXPECT(it != map_.end(), "SsdTier {}: no page {}", params_.path, key);
    KVD_EXPECT(bit < page_bytes_ * 8, "SsdTier: bit {} outside a {}-byte page", bit, page_bytes_);
    const int fd = buffered_fd(data_fd_);
    const auto at = static_cast<off_t>(slot_offset(it->second.slot) + bit / 8);
    unsigned char c = 0;
    KVD_EXPECT(::pread(fd, &c, 1, at) == 1, "SsdTier {}: cannot read back page {}", params_.path, key);
    c = static_cast<unsigned char>(c ^ (1u << (bit % 8)));
    KVD_EXPECT(::pwrite(fd, &c, 1, at) == 1 && ::fdatasync(fd) == 0, "SsdTier {}: cannot flip a bit of page {}", params_.path, key);
  }

  /// Deletes a store's files (for tests and tools); missing files are fine.
  static void remove_files(const std::string& path) {
    ::unlink(path.c_str());
    ::unlink((path + ".log").c_str());
  }

 private:
  struct Entry {
    std::uint64_t slot;
    std::uint64_t hash;
  };
  struct StreamKey {
    std::uint64_t sequence;
    std::uint32_t layer, head;
    friend bool operator==(const StreamKey&, const StreamKey&) = default;
  };
  struct StreamKeyHash {
    std::size_t operator()(const StreamKey& k) const noexcept { return PageKeyHash{}(PageKey{k.sequence, k.layer, k.head, 0}); }
  };
  struct Extent {
    std::uint64_t next = 0, end = 0;
  };
  struct AlignedFree {
    void operator()(std::byte* p) const { std::free(p); }
  };

  static std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

  void check_open() const {
    KVD_EXPECT(data_fd_ >= 0, "SsdTier {}: not open", params_.path);
    KVD_EXPECT(!dead_, "SsdTier {}: the (simulated) power went out; reopen the store", params_.path);
  }

  int open_file(const std::string& path, bool existing) {
    const int flags = O_RDWR | O_CLOEXEC | (existing ? 0 : O_CREAT | O_EXCL);
    int fd = -1;
    if (params_.direct_io) {
      fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
      if (fd < 0 && errno == EINVAL) {  // the file system refuses O_DIRECT (tmpfs): buffered I/O
        fd = ::open(path.c_str(), flags, 0644);
        direct_ = false;
      } else {
        direct_ = fd >= 0;
      }
    } else {
      fd = ::open(path.c_str(), flags, 0644);
      direct_ = false;
    }
    KVD_EXPECT(fd >= 0, "SsdTier: cannot open {}: {}", path, std::strerror(errno));
    return fd;
  }

  static std::size_t dio_alignment(int fd) {
#ifdef STATX_DIOALIGN
    struct statx sx {};
    if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align > 0)
      return std::max<std::size_t>({sx.stx_dio_offset_align, sx.stx_dio_mem_align, 512});
#else
    (void)fd;
#endif
    return 4096;
  }

  void sync_directory() const {
    const std::size_t slash = params_.path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : params_.path.substr(0, slash);
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    ::fsync(fd);
    ::close(fd);
  }

  struct Want {
    std::uint64_t slot, hash;
    const ReadRequest* req;
  };
  /// A submitted batch: its requests, the I/Os that read them, and their buffers.
  struct ReadBatch {
    std::vector<ReadRequest> reads;
    std::vector<Want> want;          ///< by slot
    std::vector<IoRead> ops;         ///< runs of adjacent slots
    std::vector<std::size_t> first;  ///< first want of each op
    std::vector<::iovec> iov;        ///< scattered: one buffer per page
    std::unique_ptr<std::byte, AlignedFree> bounce;
    bool scatter = false;
    IoToken token = 0;
  };

  /// Maps the batch's pages to slots, merges adjacent slots into I/Os, and starts them. Pages
  /// go straight into the callers' buffers (one readv per run of adjacent slots) when direct
  /// I/O allows it: every buffer aligned and no slot padding. Otherwise runs are read into the
  /// batch's own bounce buffer and copied out in wait().
  void plan_reads(ReadBatch& b) {
    for (const ReadRequest& r : b.reads) {
      auto it = map_.find(r.key);
      KVD_EXPECT(it != map_.end(), "SsdTier {}: no page {}", params_.path, r.key);
      b.want.push_back({it->second.slot, it->second.hash, &r});
    }
    std::sort(b.want.begin(), b.want.end(), [](const Want& x, const Want& y) { return x.slot < y.slot; });
    b.scatter = slot_bytes_ == page_bytes_;
    for (std::size_t i = 0; b.scatter && i < b.want.size(); ++i)
      b.scatter = !direct_ || reinterpret_cast<std::uintptr_t>(b.want[i].req->dst) % align_ == 0;
    std::size_t total = 0;
    const std::size_t max_run = b.scatter ? IoEngine::kMaxIov : std::numeric_limits<std::size_t>::max();
    for (std::size_t i = 0; i < b.want.size();) {
      std::size_t j = i + 1;
      while (j < b.want.size() && b.want[j].slot == b.want[j - 1].slot + 1 && (j - i + 1) * slot_bytes_ <= params_.max_merge_bytes &&
             j - i < max_run)
        ++j;
      b.ops.push_back({slot_offset(b.want[i].slot), (j - i) * slot_bytes_, nullptr, 0});
      b.first.push_back(i);
      total += (j - i) * slot_bytes_;
      i = j;
    }
    if (b.scatter) {
      b.iov.reserve(b.want.size());
      for (const Want& w : b.want) b.iov.push_back({w.req->dst, page_bytes_});
      for (std::size_t o = 0; o < b.ops.size(); ++o) {
        if (b.ops[o].len == slot_bytes_) {  // one page: a plain read, fixed where the buffer is registered
          b.ops[o].buf = b.want[b.first[o]].req->dst;
          continue;
        }
        b.ops[o].iov = b.iov.data() + b.first[o];
        b.ops[o].iov_count = static_cast<unsigned>(b.ops[o].len / slot_bytes_);
      }
    } else {
      void* p = nullptr;
      KVD_EXPECT(::posix_memalign(&p, align_, round_up(total, align_)) == 0, "SsdTier: cannot allocate {} bytes", total);
      b.bounce.reset(static_cast<std::byte*>(p));
      std::size_t at = 0;
      for (IoRead& op : b.ops) {
        op.buf = b.bounce.get() + at;
        at += op.len;
      }
    }
    b.token = io_.start(data_fd_, b.ops);
    scattered_ops_ += b.scatter ? b.ops.size() : 0;
    ++read_batches_;
    read_ops_ += b.ops.size();
  }

  std::byte* bounce(std::size_t bytes) {
    if (bytes > bounce_bytes_) {
      void* p = nullptr;
      KVD_EXPECT(::posix_memalign(&p, align_, round_up(bytes, align_)) == 0, "SsdTier: cannot allocate {} bytes", bytes);
      bounce_.reset(static_cast<std::byte*>(p));
      bounce_bytes_ = round_up(bytes, align_);
    }
    return bounce_.get();
  }

  void pwrite_all(int fd, const std::byte* buf, std::size_t len, std::uint64_t offset, const std::string& file, const PageKey& key) {
    if (power_.armed) power_.before_write(*this, fd, buf, len, offset);
    std::size_t done = 0;
    while (done < len) {
      const ssize_t n = ::pwrite(fd, buf + done, len - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == ENOSPC) fail("SsdTier {}: the disk is full (writing page {}); the pages stored before stay readable", file, key);
      KVD_EXPECT(n > 0, "SsdTier {}: write error at page {}: {}", file, key, n < 0 ? std::strerror(errno) : "no progress");
      done += static_cast<std::size_t>(n);
    }
  }

  void sync(int fd, const std::string& file) {
#ifndef KVD_SSD_MUTATE_NO_SYNC
    if (power_.armed) power_.before_sync(*this, fd);
    KVD_EXPECT(::fdatasync(fd) == 0, "SsdTier {}: fdatasync failed: {}", file, std::strerror(errno));
#else  // the durability tests' mutation check: a store that syncs nothing must fail them
    if (power_.armed) power_.tick(*this);
    (void)fd;
    (void)file;
#endif
  }

  /// Power-loss simulation (tests): every write since a file's last sync is undone at the
  /// chosen operation, except that the last one is torn (its first half lands).
  struct PowerLossSim {
    struct Unsynced {
      int fd;
      std::uint64_t offset;
      std::uint64_t old_size;
      std::vector<std::byte> before, after;
    };
    bool armed = false;
    std::uint64_t countdown = 0;  ///< operations left before the power goes
    std::vector<Unsynced> unsynced;

    void tick(SsdTier& t) {
      if (countdown > 1) {
        --countdown;
        return;
      }
      // The power goes now: drop unsynced writes newest first, then tear the newest.
      armed = false;
      for (auto it = unsynced.rbegin(); it != unsynced.rend(); ++it) {
        raw_write(t, it->fd, it->before.data(), it->before.size(), it->offset);
        ::ftruncate(t.buffered_fd(it->fd), static_cast<off_t>(it->old_size));
      }
      if (!unsynced.empty()) {
        const Unsynced& last = unsynced.back();
        const std::size_t half = last.after.size() / 2 / 512 * 512;
        raw_write(t, last.fd, last.after.data(), std::max<std::size_t>(half, 256), last.offset);
      }
      unsynced.clear();
      t.dead_ = true;
      fail("SsdTier {}: simulated power loss", t.params_.path);
    }
    void before_write(SsdTier& t, int fd, const std::byte* buf, std::size_t len, std::uint64_t offset) {
      tick(t);
      struct stat st {};
      ::fstat(fd, &st);
      Unsynced u{fd, offset, static_cast<std::uint64_t>(st.st_size), {}, std::vector<std::byte>(buf, buf + len)};
      const std::uint64_t end = std::min<std::uint64_t>(offset + len, u.old_size);
      if (end > offset) {
        u.before.resize(end - offset);
        ::pread(t.buffered_fd(fd), u.before.data(), u.before.size(), static_cast<off_t>(offset));
      }
      unsynced.push_back(std::move(u));
    }
    void before_sync(SsdTier& t, int fd) {
      tick(t);
      std::erase_if(unsynced, [&](const Unsynced& u) { return u.fd == fd; });
    }
    static void raw_write(SsdTier& t, int fd, const std::byte* buf, std::size_t len, std::uint64_t offset) {
      if (len > 0) (void)!::pwrite(t.buffered_fd(fd), buf, len, static_cast<off_t>(offset));
    }
  };

  /// A buffered descriptor of the same file (the simulation writes unaligned pieces).
  int buffered_fd(int fd) {
    int& b = fd == data_fd_ ? data_buffered_ : log_buffered_;
    if (b < 0) b = ::open((fd == data_fd_ ? params_.path : params_.path + ".log").c_str(), O_RDWR | O_CLOEXEC);
    return b;
  }

  void write_header(int fd, const char (&magic)[8], const std::string& file) {
    ssd_format::Header h;
    std::memcpy(h.magic, magic, 8);
    h.alignment = static_cast<std::uint32_t>(align_);
    h.page_bytes = page_bytes_;
    h.slot_bytes = slot_bytes_;
    h.checksum = h.compute_checksum();
    std::byte* buf = bounce(align_);
    std::memset(buf, 0, align_);
    std::memcpy(buf, &h, sizeof h);
    pwrite_all(fd, buf, align_, 0, file, PageKey{});
    sync(fd, file);
  }

  ssd_format::Header read_header(int fd, const char (&magic)[8], const std::string& file) {
    std::byte* buf = bounce(align_);
    IoRead r{0, align_, buf, 0};
    IoEngine once;
    once.open(IoBackend::threads, 1, 1);
    once.read_all(fd, std::span<IoRead>(&r, 1));
    KVD_EXPECT(r.result >= static_cast<std::int64_t>(sizeof(ssd_format::Header)), "{} is not a kvdrive store (too short: {} bytes)",
               file, r.result < 0 ? 0 : r.result);
    ssd_format::Header h;
    std::memcpy(&h, buf, sizeof h);
    KVD_EXPECT(std::memcmp(h.magic, magic, 8) == 0 && h.checksum == h.compute_checksum(), "{} is not a kvdrive store (bad header)",
               file);
    KVD_EXPECT(h.version == ssd_format::kVersion, "{}: store format version {}, this build reads version {}", file, h.version,
               ssd_format::kVersion);
    KVD_EXPECT(h.page_bytes == page_bytes_, "{}: a store of {}-byte pages, opened for {}-byte pages (another model shape or page size)",
               file, h.page_bytes, page_bytes_);
    return h;
  }

  void recover() {
    const ssd_format::Header dh = read_header(data_fd_, ssd_format::kDataMagic, params_.path);
    // The store's own alignment lays out its slots; the device's must divide it.
    KVD_EXPECT(dh.alignment >= 512 && (dh.alignment & (dh.alignment - 1)) == 0 && dh.alignment % align_ == 0,
               "{}: made with {}-byte alignment, but this device needs {}", params_.path, dh.alignment, align_);
    align_ = dh.alignment;
    const ssd_format::Header lh = read_header(log_fd_, ssd_format::kLogMagic, params_.path + ".log");
    KVD_EXPECT(lh.slot_bytes == dh.slot_bytes && lh.alignment == dh.alignment, "{}: data and log headers disagree", params_.path);
    slot_bytes_ = dh.slot_bytes;
    KVD_EXPECT(slot_bytes_ >= page_bytes_ && slot_bytes_ % dh.alignment == 0, "{}: bad slot size {}", params_.path, slot_bytes_);
    // Replay the log a chunk of blocks at a time; stop at the first bad block.
    struct stat st {};
    KVD_EXPECT(::fstat(log_fd_, &st) == 0, "{}.log: stat failed: {}", params_.path, std::strerror(errno));
    const auto log_size = static_cast<std::uint64_t>(st.st_size);
    constexpr std::size_t kChunkBlocks = 256;
    const std::size_t per_block = align_ / sizeof(ssd_format::LogRecord);
    std::uint64_t at = align_, expected = 1;
    bool stop = false;
    IoEngine once;
    once.open(IoBackend::threads, 1, 1);
    struct stat dst {};
    KVD_EXPECT(::fstat(data_fd_, &dst) == 0, "{}: stat failed: {}", params_.path, std::strerror(errno));
    const auto data_size = static_cast<std::uint64_t>(dst.st_size);
    while (!stop && at < log_size) {
      const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(kChunkBlocks * align_, round_up(log_size - at, align_)));
      std::byte* buf = bounce(len);
      IoRead r{at, len, buf, 0};
      once.read_all(log_fd_, std::span<IoRead>(&r, 1));
      KVD_EXPECT(r.result >= 0, "{}.log: read error during recovery: {}", params_.path, std::strerror(static_cast<int>(-r.result)));
      const std::size_t blocks = static_cast<std::size_t>(r.result) / align_;
      if (blocks == 0) break;
      for (std::size_t b = 0; b < blocks && !stop; ++b) {
        const std::byte* block = buf + b * align_;
        std::vector<ssd_format::LogRecord> recs;
        bool ok = true;
        for (std::size_t i = 0; i < per_block && ok; ++i) {
          ssd_format::LogRecord rec;
          std::memcpy(&rec, block + i * sizeof rec, sizeof rec);
          if (rec.sequence == 0) {  // padding: the rest of the block must be zero
            for (std::size_t k = i * sizeof rec; k < align_; ++k) ok = ok && block[k] == std::byte{0};
            break;
          }
          // A put's data was synced before its record: its slot lies inside the data file.
          ok = rec.valid() && rec.sequence == expected + recs.size() &&
               (rec.kind == ssd_format::RecordKind::erase ||
                (rec.kind == ssd_format::RecordKind::put && rec.slot < data_size / slot_bytes_ &&
                 align_ + (rec.slot + 1) * slot_bytes_ <= data_size));
          if (ok) recs.push_back(rec);
        }
        if (!ok || recs.empty()) {  // torn, unwritten or garbage: the log ends before this block
          stop = true;
          break;
        }
        for (const ssd_format::LogRecord& rec : recs) apply(rec);
        expected += recs.size();
        at += align_;
      }
      if (blocks < len / align_) break;
    }
    log_end_ = at;
    next_sequence_ = expected;
    // Cut the log at its end, so that blocks past a torn one can never be replayed later.
    KVD_EXPECT(::ftruncate(log_fd_, static_cast<off_t>(log_end_)) == 0 && ::fdatasync(log_fd_) == 0,
               "{}.log: cannot cut the log after recovery: {}", params_.path, std::strerror(errno));
    // Slots: everything below the high-water mark that no page holds is free.
    std::uint64_t high = 0;
    std::vector<bool> used;
    for (const auto& [key, e] : map_) high = std::max(high, e.slot + 1);
    used.assign(high, false);
    for (const auto& [key, e] : map_) used[e.slot] = true;
    for (std::uint64_t s = 0; s < high; ++s)
      if (!used[s]) free_slots_.push_back(s);
    std::reverse(free_slots_.begin(), free_slots_.end());  // lowest first when popped from the back
    sorted_free_ = free_slots_.size();
    high_water_ = high;
  }

  void apply(const ssd_format::LogRecord& rec) {
    if (rec.kind == ssd_format::RecordKind::put)
      map_[rec.key()] = Entry{rec.slot, rec.data_hash};
    else
      map_.erase(rec.key());
  }

  ssd_format::LogRecord make_record(ssd_format::RecordKind kind, const PageKey& key, std::uint64_t slot, std::uint64_t hash) const {
    ssd_format::LogRecord r;
    r.kind = kind;
    r.seq_id = key.sequence;
    r.layer = key.layer;
    r.head = key.head;
    r.page = key.page;
    r.slot = slot;
    r.data_hash = hash;
    return r;
  }

  /// Numbers the records from next_sequence_, writes them in fresh blocks and syncs. Does not
  /// advance next_sequence_ (the caller does once the batch is visible).
  void append_log(std::vector<ssd_format::LogRecord>& records) {
    const std::size_t per_block = align_ / sizeof(ssd_format::LogRecord);
    const std::size_t blocks = (records.size() + per_block - 1) / per_block;
    const std::size_t len = blocks * align_;
    std::byte* buf = bounce(len);
    std::memset(buf, 0, len);
    for (std::size_t i = 0; i < records.size(); ++i) {
      records[i].sequence = next_sequence_ + i;
      records[i].checksum = records[i].compute_checksum();
      std::memcpy(buf + (i / per_block) * align_ + (i % per_block) * sizeof(ssd_format::LogRecord), &records[i], sizeof records[i]);
    }
    pwrite_all(log_fd_, buf, len, log_end_, params_.path + ".log", records.front().key());
    sync(log_fd_, params_.path + ".log");
    log_end_ += len;
  }

  /// After a failed append: cut the log back to its last committed block, so that a record
  /// that may have landed cannot point at slots handed out again. If even that fails, the
  /// store refuses further calls (reopen it).
  void roll_back_log() {
    if (dead_) return;
    if (::ftruncate(log_fd_, static_cast<off_t>(log_end_)) != 0 || ::fdatasync(log_fd_) != 0) dead_ = true;
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
    for (std::uint64_t s : pending_free_) free_slots_.push_back(s);
    pending_free_.clear();
    order_free_slots();
  }

  /// Free slots are taken lowest first (from the back), so a batch that reuses them gets runs
  /// of adjacent slots where they exist: what packing and merged reads rely on.
  void order_free_slots() {
    // The list is kept sorted (descending); only the slots appended since are out of place.
    auto tail = free_slots_.begin() + static_cast<std::ptrdiff_t>(std::min(sorted_free_, free_slots_.size()));
    std::sort(tail, free_slots_.end(), std::greater<>());
    std::inplace_merge(free_slots_.begin(), tail, free_slots_.end(), std::greater<>());
    sorted_free_ = free_slots_.size();
  }

  /// A slot for the page: its stream's extent, a fresh extent, a free slot, or any stream's
  /// extent; throws when the capacity is reached.
  std::uint64_t allocate_slot(const PageKey& key) {
    Extent& ex = extents_[StreamKey{key.sequence, key.layer, key.head}];
    if (ex.next < ex.end) return ex.next++;
    if (!free_slots_.empty()) {  // freed slots (durably) first, so the file does not grow forever
      const std::uint64_t s = free_slots_.back();
      free_slots_.pop_back();
      return s;
    }
    const std::uint64_t cap = params_.capacity_pages ? params_.capacity_pages : std::numeric_limits<std::uint64_t>::max();
    if (high_water_ < cap) {
      const std::uint64_t n = std::min<std::uint64_t>(params_.extent_pages, cap - high_water_);
      ex = Extent{high_water_ + 1, high_water_ + n};
      high_water_ += n;
      return ex.next - 1;
    }
    for (auto& [stream, other] : extents_)
      if (other.next < other.end) return other.next++;
    fail("SsdTier {}: full ({} pages); page {} does not fit", params_.path, params_.capacity_pages, key);
  }

  Params params_;
  mutable std::mutex mutex_;
  int data_fd_ = -1, log_fd_ = -1;
  bool direct_ = false;
  std::size_t page_bytes_ = 0, slot_bytes_ = 0, align_ = 4096;
  std::uint64_t log_end_ = 0, next_sequence_ = 1, high_water_ = 0;
  std::unordered_map<PageKey, Entry, PageKeyHash> map_;
  std::unordered_map<StreamKey, Extent, StreamKeyHash> extents_;
  std::vector<std::uint64_t> free_slots_, pending_free_;
  std::size_t sorted_free_ = 0;  ///< free_slots_[0, sorted_free_) is in order (see order_free_slots)
  std::vector<ssd_format::LogRecord> pending_erases_;
  std::map<ReadTicket, ReadBatch> batches_;  ///< submitted, not yet waited for (their reads may be in flight)
  ReadTicket tickets_ = 0;
  std::unique_ptr<std::byte, AlignedFree> bounce_;
  std::size_t bounce_bytes_ = 0;
  IoEngine io_;
  std::uint64_t read_batches_ = 0, read_ops_ = 0, scattered_ops_ = 0;
  PowerLossSim power_;
  bool dead_ = false;  ///< after a simulated power loss: every call fails
  int data_buffered_ = -1, log_buffered_ = -1;
};
static_assert(StorageTier<SsdTier>);

}  // namespace kvdrive::tier
