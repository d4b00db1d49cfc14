// tier::PrefixStore: shared prompt pages kept in a local folder across runs, a RemoteTier
// (tier/remote.hpp) that KvManager::share_prefixes() takes as it takes RedisTier. Prefill
// publishes a prompt's whole pages under their chained content keys; load_prefix() of a later
// sequence, in this process or after a restart, reads the longest stored run of its leading
// pages instead of computing them, whatever follows them (a long document with a new question).
// docs/remote.md, "A local prefix store".
//
// - Files: one per page key, DIR/<model digest>-<page digest>.kvp, holding that page for every
//   (layer, KV head): a 64-byte header (magic, page bytes, layers, heads, the model's and the
//   page's digests, its own checksum), an xxh3-64 checksum per page, then the pages [layer][head].
//   A file is written whole under a temporary name, synced, and renamed into place (then the
//   folder is synced), so a crash leaves a whole file or none; temporaries left by a crash are
//   deleted on open.
// - A page key is stored once every layer and head of it has been published; until then its
//   pages wait in memory (at most Params::max_pending_bytes; past that they are not stored).
// - Checks: a file that is short, has a bad header, or a page that fails its checksum is a miss
//   ("corrupt"), never data; the file is deleted so that the page is stored again.
// - Retention: Params::capacity_bytes over the folder's .kvp files (any model's); a file that
//   would pass it first deletes the least recently used ones. A file's mtime is its last use
//   (written, or read by load_prefix), so the order survives restarts. A prompt never evicts
//   its own pages: when the least recently used file is one of them, the page key being stored is
//   not stored (over_budget), so a prompt larger than the capacity keeps the leading run that fit.
//   A later page is useless without the pages before it, so a prompt's run is marked used last
//   page first: its tail goes before its head.
// - One process at a time: an exclusive flock on DIR/lock, taken by the constructor; the holder's
//   pid is written in it so that the error names it. Thread-safe (one mutex); reads and writes
//   run in the caller's thread.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvdrive/core/digest.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/xxhash.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/remote.hpp"

namespace kvdrive::tier {

namespace prefix_store {

/// The header of a .kvp file.
struct FileHeader {
  static constexpr char kMagic[8] = {'K', 'V', 'D', 'P', 'F', 'X', '0', '1'};
  char magic[8];
  std::uint32_t page_bytes, layers, heads, reserved;
  std::uint64_t model_low, model_high, page_low, page_high;
  std::uint64_t checksum;  ///< xxh3-64 of the bytes above

  std::uint64_t sum() const { return XXH3_64bits(this, offsetof(FileHeader, checksum)); }
};
static_assert(sizeof(FileHeader) == 64);

/// A page's checksum: xxh3-64 of its bytes, seeded with its page key and its (layer, head) slot.
inline std::uint64_t page_sum(const PrefixDigest& key, std::size_t slot, const std::byte* page, std::size_t n) {
  return XXH3_64bits_withSeed(page, n, key.low ^ (key.high * 0x9E3779B97F4A7C15ull) ^ slot);
}

/// An owned file descriptor.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

inline bool pwrite_all(int fd, const void* buf, std::size_t n, off_t at) {
  const auto* p = static_cast<const std::byte*>(buf);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w, n -= static_cast<std::size_t>(w), at += w;
  }
  return true;
}

inline bool pread_all(int fd, void* buf, std::size_t n, off_t at) {
  auto* p = static_cast<std::byte*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, at);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r, n -= static_cast<std::size_t>(r), at += r;
  }
  return true;
}

inline std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

/// Sets a file's mtime (its last use) to `ns` exactly, so that the order read back on open is
/// the order kept in memory (the kernel's own timestamps are coarser).
inline void set_mtime(int fd, std::int64_t ns) {
  const timespec t{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  const timespec times[2] = {t, t};
  (void)::futimens(fd, times);
}

}  // namespace prefix_store

class PrefixStore {
 public:
  struct Params {
    std::string dir{};                               ///< the store's folder (made if missing; its parent must exist)
    PrefixDigest model{};                            ///< what else decides the K/V (weights, RoPE, ...): required
    std::uint64_t capacity_bytes = std::uint64_t{8} << 30;  ///< bytes of .kvp files kept; least recently used go first
    std::size_t max_pending_bytes = std::size_t{256} << 20;  ///< pages waiting for their other layers
    bool sync = true;                                ///< fdatasync each file and the folder (durable across power loss)
  };

  /// Opens (or makes) the folder and locks it for this process; throws kvdrive::Error if another
  /// store holds it, naming the holder's pid.
  explicit PrefixStore(Params p) : p_(std::move(p)) {
    KVD_EXPECT(!p_.dir.empty(), "PrefixStore: no folder given");
    KVD_EXPECT(p_.model.low != 0 || p_.model.high != 0, "PrefixStore {}: no model digest (Params::model): pages of different models would meet",
               p_.dir);
    KVD_EXPECT(p_.capacity_bytes > 0, "PrefixStore {}: capacity_bytes must be > 0", p_.dir);
    if (::mkdir(p_.dir.c_str(), 0700) != 0)
      KVD_EXPECT(errno == EEXIST, "PrefixStore: cannot make the folder {}: {}", p_.dir, std::strerror(errno));
    lock();
    scan();
  }
  PrefixStore(PrefixStore&&) = default;
  PrefixStore& operator=(PrefixStore&&) = delete;
  ~PrefixStore() {
    if (lock_.fd >= 0) (void)::ftruncate(lock_.fd, 0);  // the pid names a holder only while it holds the lock
  }

  const Params& params() const { return p_; }
  std::string describe() const { return fmt::format("prefix store {}", p_.dir); }

  /// The page size and the streams a page key names; opening again must give the same.
  void open(const TierGeometry& g) {
    std::lock_guard lock(*mu_);
    KVD_EXPECT(g.page_bytes > 0 && g.layers > 0 && g.kv_heads > 0,
               "PrefixStore {}: open needs the page size, layers and KV heads (got {} bytes, {} layers, {} heads)", p_.dir, g.page_bytes,
               g.layers, g.kv_heads);
    KVD_EXPECT(g_.page_bytes == 0 || (g.page_bytes == g_.page_bytes && g.layers == g_.layers && g.kv_heads == g_.kv_heads),
               "PrefixStore {}: opened again with another geometry", p_.dir);
    g_ = g;
  }

  /// Stores the pages of every page key whose layers and heads are now all published (missing
  /// ones wait in memory). Best effort: never throws; what is not stored is counted.
  void publish(PageChain chain, std::span<const WriteRequest> pages) noexcept {
    try {
      std::lock_guard lock(*mu_);
      if (g_.page_bytes == 0) return;
      bool wrote = false;
      std::set<std::string> own;  // the chain's file names, made when an eviction first needs them
      for (const WriteRequest& w : pages) {
        if (w.key.page >= chain.size() || w.key.layer >= g_.layers || w.key.head >= g_.kv_heads) continue;
        const PrefixDigest& key = chain[w.key.page];
        const std::string name = file_name(key);
        if (entries_.contains(name)) continue;  // stored already (the same tokens)
        Pending* pend = pending(key);
        if (pend == nullptr) {
          stats_.dropped += 1;
          continue;
        }
        const std::size_t slot = static_cast<std::size_t>(w.key.layer) * g_.kv_heads + w.key.head;
        if (!pend->have[slot]) {
          std::memcpy(pend->bytes.data() + slot * g_.page_bytes, w.src, g_.page_bytes);
          pend->have[slot] = 1;
          pend->count += 1;
        }
        if (pend->count == streams()) {
          wrote |= store(key, name, *pend, chain, own);
          pending_bytes_ -= pend->bytes.size();
          pending_.erase(key_of(key));
        }
      }
      if (wrote) {
        mark_run_used(chain, stored_run(chain));
        if (p_.sync) sync_dir();
      }
    } catch (...) {  // out of memory: not storing these pages is allowed
    }
  }

  /// How many leading page keys of the chain are stored for every layer < layers and head < heads.
  std::uint32_t lookup(PageChain chain, std::uint32_t layers, std::uint32_t heads) {
    std::lock_guard lock(*mu_);
    stats_.lookups += 1;
    if (layers > g_.layers || heads > g_.kv_heads) return 0;
    return stored_run(chain);
  }

  /// Reads pages (each read's PageKey::page indexes the chain) and checks them; the outcome of
  /// each is kept for wait_each(). Reads run here, in the caller's thread.
  ReadTicket submit(PageChain chain, std::span<const ReadRequest> reads) {
    std::lock_guard lock(*mu_);
    KVD_EXPECT(g_.page_bytes > 0, "PrefixStore {}: used before open()", p_.dir);
    std::vector<RemoteRead> out(reads.size(), RemoteRead::missing);
    // One open file per page key: reads of one page key's streams share it.
    std::map<std::uint32_t, std::vector<std::size_t>> by_page;
    for (std::size_t i = 0; i < reads.size(); ++i) {
      KVD_EXPECT(reads[i].key.page < chain.size(), "PrefixStore: page {} is past its chain of {} pages", reads[i].key, chain.size());
      by_page[reads[i].key.page].push_back(i);
    }
    std::vector<std::uint32_t> found;
    for (const auto& [page, which] : by_page)
      if (read_file(chain[page], reads, which, out)) found.push_back(page);
    for (auto p = found.rbegin(); p != found.rend(); ++p) mark_used(file_name(chain[*p]));  // the head last: it goes last
    for (RemoteRead r : out) {
      stats_.hits += r == RemoteRead::hit;
      stats_.missing += r == RemoteRead::missing;
      stats_.corrupt += r == RemoteRead::corrupt;
      stats_.errors += r == RemoteRead::error;
      if (r == RemoteRead::hit) stats_.bytes_read += g_.page_bytes;
    }
    const ReadTicket t = ++next_ticket_;
    tickets_.emplace(t, std::move(out));
    return t;
  }

  /// Each read's outcome, in submit order.
  void wait_each(ReadTicket ticket, std::span<RemoteRead> outcomes) {
    std::lock_guard lock(*mu_);
    const auto it = tickets_.find(ticket);
    KVD_EXPECT(it != tickets_.end(), "PrefixStore: unknown read ticket {}", ticket);
    KVD_EXPECT(outcomes.size() >= it->second.size(), "PrefixStore: {} outcomes for {} reads", outcomes.size(), it->second.size());
    std::copy(it->second.begin(), it->second.end(), outcomes.begin());
    tickets_.erase(it);
  }

  RemoteStats remote_stats() const {
    std::lock_guard lock(*mu_);
    return stats_;
  }
  /// Page keys stored (files, of any model) and their bytes.
  std::size_t stored_keys() const {
    std::lock_guard lock(*mu_);
    return entries_.size();
  }
  std::uint64_t stored_bytes() const {
    std::lock_guard lock(*mu_);
    return stored_bytes_;
  }
  /// Files deleted to keep within capacity_bytes, since this object was made.
  std::uint64_t evicted() const {
    std::lock_guard lock(*mu_);
    return evicted_;
  }
  /// The file that holds a page key's pages (for this model).
  std::string file_path(const PrefixDigest& page) const { return p_.dir + "/" + file_name(page); }

 private:
  struct Pending {
    std::vector<std::byte> bytes;  // [layer][head] pages
    std::vector<std::uint8_t> have;
    std::size_t count = 0;
  };
  struct Entry {
    std::uint64_t bytes = 0;
    std::int64_t used_ns = 0;
  };

  std::size_t streams() const { return static_cast<std::size_t>(g_.layers) * g_.kv_heads; }
  std::uint64_t file_bytes() const { return sizeof(prefix_store::FileHeader) + streams() * (8 + g_.page_bytes); }
  static std::pair<std::uint64_t, std::uint64_t> key_of(const PrefixDigest& d) { return {d.low, d.high}; }
  std::string file_name(const PrefixDigest& page) const { return fmt::format("{}-{}.kvp", p_.model.hex(), page.hex()); }

  Pending* pending(const PrefixDigest& key) {
    auto it = pending_.find(key_of(key));
    if (it != pending_.end()) return &it->second;
    const std::size_t bytes = streams() * g_.page_bytes;
    if (pending_bytes_ + bytes > p_.max_pending_bytes) return nullptr;
    Pending& pend = pending_[key_of(key)];
    pend.bytes.resize(bytes);
    pend.have.assign(streams(), 0);
    pending_bytes_ += bytes;
    return &pend;
  }

  /// Makes room for `bytes` more by deleting the least recently used files, but never one of
  /// `chain`'s own pages (`own`: their names, filled on first need); false if that is not enough.
  bool make_room(std::uint64_t bytes, PageChain chain, std::set<std::string>& own) {
    if (bytes > p_.capacity_bytes) return false;
    while (stored_bytes_ + bytes > p_.capacity_bytes && !by_use_.empty()) {
      if (own.empty())
        for (const PrefixDigest& d : chain) own.insert(file_name(d));
      const std::string victim = by_use_.begin()->second;
      if (own.contains(victim)) return false;
      evict(victim);
    }
    return stored_bytes_ + bytes <= p_.capacity_bytes;
  }

  /// Writes a page key's file (temporary name, sync, rename); true if it was stored.
  bool store(const PrefixDigest& key, const std::string& name, const Pending& pend, PageChain chain, std::set<std::string>& own) {
    const std::uint64_t bytes = file_bytes();
    if (!make_room(bytes, chain, own)) {
      stats_.over_budget += streams();
      return false;
    }
    prefix_store::FileHeader h{};
    std::memcpy(h.magic, prefix_store::FileHeader::kMagic, 8);
    h.page_bytes = static_cast<std::uint32_t>(g_.page_bytes), h.layers = g_.layers, h.heads = g_.kv_heads;
    h.model_low = p_.model.low, h.model_high = p_.model.high, h.page_low = key.low, h.page_high = key.high;
    h.checksum = h.sum();
    std::vector<std::uint64_t> sums(streams());
    for (std::size_t s = 0; s < sums.size(); ++s)
      sums[s] = prefix_store::page_sum(key, s, pend.bytes.data() + s * g_.page_bytes, g_.page_bytes);
    const std::string tmp = fmt::format("{}/.tmp-{}-{}", p_.dir, ::getpid(), ++temporaries_);
    const std::int64_t now = next_stamp();
    bool ok = false;
    {
      prefix_store::Fd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      ok = f.fd >= 0 && prefix_store::pwrite_all(f.fd, &h, sizeof h, 0) &&
           prefix_store::pwrite_all(f.fd, sums.data(), sums.size() * 8, sizeof h) &&
           prefix_store::pwrite_all(f.fd, pend.bytes.data(), pend.bytes.size(), static_cast<off_t>(sizeof h + sums.size() * 8)) &&
           (!p_.sync || ::fdatasync(f.fd) == 0);
      if (ok) prefix_store::set_mtime(f.fd, now);
    }
    ok = ok && ::rename(tmp.c_str(), (p_.dir + "/" + name).c_str()) == 0;
    if (!ok) {
      (void)::unlink(tmp.c_str());
      stats_.write_errors += streams();
      return false;
    }
    add_entry(name, bytes, now);
    stats_.written += streams();
    stats_.bytes_written += pend.bytes.size();
    return true;
  }

  /// How many leading page keys of the chain have files.
  std::uint32_t stored_run(PageChain chain) const {
    std::uint32_t n = 0;
    while (n < chain.size() && entries_.contains(file_name(chain[n]))) ++n;
    return n;
  }

  /// Marks a file used now (its mtime and the in-memory order; stamps strictly increase).
  void mark_used(const std::string& name) {
    const std::int64_t now = next_stamp();
    const std::string path = p_.dir + "/" + name;
    const timespec t{static_cast<time_t>(now / 1'000'000'000), static_cast<long>(now % 1'000'000'000)};
    const timespec times[2] = {t, t};
    (void)::utimensat(AT_FDCWD, path.c_str(), times, 0);
    touch(name, now);
  }

  /// Marks the chain's first `n` files used, last page first.
  void mark_run_used(PageChain chain, std::uint32_t n) {
    for (std::uint32_t p = n; p-- > 0;) mark_used(file_name(chain[p]));
  }

  /// Now, in ns, and later than every stamp given before (the clock may stand still or step back).
  std::int64_t next_stamp() { return last_stamp_ = std::max(prefix_store::now_ns(), last_stamp_ + 1); }

  /// Reads the pages `which` of one page key's file into their buffers; true if all were read.
  bool read_file(const PrefixDigest& key, std::span<const ReadRequest> reads, const std::vector<std::size_t>& which,
                 std::vector<RemoteRead>& out) {
    const std::string name = file_name(key);
    const auto it = entries_.find(name);
    if (it == entries_.end()) return false;  // missing
    const std::string path = p_.dir + "/" + name;
    prefix_store::Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (f.fd < 0) {
      for (std::size_t i : which) out[i] = errno == ENOENT ? RemoteRead::missing : RemoteRead::error;
      if (errno == ENOENT) drop_entry(name);
      return false;
    }
    prefix_store::FileHeader h{};
    struct stat st {};
    const bool header_ok = ::fstat(f.fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) == file_bytes() &&
                           prefix_store::pread_all(f.fd, &h, sizeof h, 0) && std::memcmp(h.magic, prefix_store::FileHeader::kMagic, 8) == 0 &&
                           h.checksum == h.sum() && h.page_bytes == g_.page_bytes && h.layers == g_.layers && h.heads == g_.kv_heads &&
                           h.model_low == p_.model.low && h.model_high == p_.model.high && h.page_low == key.low && h.page_high == key.high;
    // The page checksums, read once for the file.
    sums_.resize(streams());
    bool damaged = !header_ok || !prefix_store::pread_all(f.fd, sums_.data(), sums_.size() * 8, sizeof h);
    for (std::size_t i : which) {
      if (damaged) {
        out[i] = RemoteRead::corrupt;
        continue;
      }
      const PageKey& k = reads[i].key;
      if (k.layer >= g_.layers || k.head >= g_.kv_heads) {
        out[i] = RemoteRead::missing;
        continue;
      }
      const std::size_t slot = static_cast<std::size_t>(k.layer) * g_.kv_heads + k.head;
      page_.resize(g_.page_bytes);
      const off_t at = static_cast<off_t>(sizeof h + streams() * 8 + slot * g_.page_bytes);
      if (!prefix_store::pread_all(f.fd, page_.data(), g_.page_bytes, at) ||
          prefix_store::page_sum(key, slot, page_.data(), g_.page_bytes) != sums_[slot]) {
        damaged = true;
        out[i] = RemoteRead::corrupt;
        continue;
      }
      std::memcpy(reads[i].dst, page_.data(), g_.page_bytes);  // the caller's buffer only ever gets checked bytes
      out[i] = RemoteRead::hit;
    }
    if (damaged) {  // never used; deleted so that the page is stored again
      for (std::size_t i : which) out[i] = RemoteRead::corrupt;
      f = prefix_store::Fd();
      (void)::unlink(path.c_str());
      drop_entry(name);
      return false;
    }
    return true;
  }

  void add_entry(const std::string& name, std::uint64_t bytes, std::int64_t used) {
    entries_[name] = {bytes, used};
    last_stamp_ = std::max(last_stamp_, used);
    by_use_.emplace(used, name);
    stored_bytes_ += bytes;
  }
  void drop_entry(const std::string& name) {
    const auto it = entries_.find(name);
    if (it == entries_.end()) return;
    by_use_.erase({it->second.used_ns, name});
    stored_bytes_ -= it->second.bytes;
    entries_.erase(it);
  }
  void touch(const std::string& name, std::int64_t used) {
    Entry& e = entries_.at(name);
    by_use_.erase({e.used_ns, name});
    e.used_ns = used;
    by_use_.emplace(used, name);
  }
  void evict(const std::string& name) {
    (void)::unlink((p_.dir + "/" + name).c_str());
    drop_entry(name);
    evicted_ += 1;
  }

  void sync_dir() {
    prefix_store::Fd d(::open(p_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (d.fd >= 0) (void)::fsync(d.fd);
  }

  void lock() {
    const std::string name = p_.dir + "/lock";
    lock_ = prefix_store::Fd(::open(name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    KVD_EXPECT(lock_.fd >= 0, "PrefixStore {}: cannot open the lock file {}: {}", p_.dir, name, std::strerror(errno));
    int rc;
    while ((rc = ::flock(lock_.fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
      const int error = errno;
      char text[32] = {};
      const ssize_t n = ::pread(lock_.fd, text, sizeof text - 1, 0);
      const long pid = n > 0 ? std::strtol(text, nullptr, 10) : 0;
      lock_ = prefix_store::Fd();
      KVD_EXPECT(error == EWOULDBLOCK, "PrefixStore {}: cannot lock {}: {}", p_.dir, name, std::strerror(error));
      fail("PrefixStore {}: the store is in use by {}; one process at a time may use a prefix store (lock file {})", p_.dir,
           pid == ::getpid() ? fmt::format("this process (pid {}): another PrefixStore has it open", pid)
                             : pid > 0 ? fmt::format("process {}", pid)
                                       : std::string("another process"),
           name);
    }
    const std::string pid = fmt::format("{}\n", ::getpid());
    if (::ftruncate(lock_.fd, 0) == 0) (void)prefix_store::pwrite_all(lock_.fd, pid.data(), pid.size(), 0);
  }

  /// Lists the folder's .kvp files (their sizes and last uses) and deletes the temporaries a
  /// crashed writer left (this process holds the lock, so no one is writing them).
  void scan() {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(p_.dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with(".tmp-")) {
        fs::remove(e.path(), ec);
        continue;
      }
      if (!name.ends_with(".kvp")) continue;
      struct stat st {};
      if (::stat(e.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      add_entry(name, static_cast<std::uint64_t>(st.st_size), static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec);
    }
    KVD_EXPECT(!ec, "PrefixStore: cannot list the folder {}: {}", p_.dir, ec.message());
  }

  Params p_;
  TierGeometry g_{};
  prefix_store::Fd lock_;
  std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();  // a unique_ptr so that a store can be moved
  std::map<std::string, Entry> entries_;                     // .kvp files by name
  std::set<std::pair<std::int64_t, std::string>> by_use_;    // (last use, name), least recent first
  std::uint64_t stored_bytes_ = 0, evicted_ = 0;
  std::map<std::pair<std::uint64_t, std::uint64_t>, Pending> pending_;
  std::size_t pending_bytes_ = 0;
  std::unordered_map<ReadTicket, std::vector<RemoteRead>> tickets_;
  ReadTicket next_ticket_ = 0;
  std::uint64_t temporaries_ = 0;
  std::int64_t last_stamp_ = 0;  // the newest use stamp given
  std::vector<std::byte> page_;
  std::vector<std::uint64_t> sums_;
  RemoteStats stats_;
};

static_assert(RemoteTier<PrefixStore>);

}  // namespace kvdrive::tier
