// tier::PrefixStore: shared prompt pages kept in a local folder across runs, a RemoteTier
// (tier/remote.hpp) that KvManager::share_prefixes() takes as it takes RedisTier. Prefill
// publishes a prompt's whole pages under their chained content keys; load_prefix() of a later
// sequence, in this process or after a restart, reads the longest stored run of its leading
// pages instead of computing them, whatever follows them (a long document with a new question).
// docs/remote.md, "A local prefix store".
//
// - Files: one per page key, DIR/<model digest>-<page digest>.kvp, holding that page for every
//   (layer, KV head): a 64-byte header (magic, page bytes, layers, heads, the model's and the
//   page's digests, its own checksum), an xxh3-64 checksum per page, then the pages [layer][head]
//   (prefix_store/file.hpp). A file is written whole under a temporary name, synced, and renamed
//   into place (then the folder is synced), so a crash leaves a whole file or none; temporaries
//   left by a crash are deleted on open (prefix_store/page_files.hpp, prefix_store/folder.hpp).
// - A page key is stored once every layer and head of it has been published; until then its
//   pages wait in memory (at most Params::max_pending_bytes; past that they are not stored).
// - Checks: a file that is short, has a bad header, or a page that fails its checksum is a miss
//   ("corrupt"), never data; the file is deleted so that the page is stored again
//   (prefix_store/page_files.hpp).
// - Retention: Params::capacity_bytes over the folder's .kvp files (any model's); a file that
//   would pass it first deletes the least recently used ones. A file's mtime is its last use
//   (written, or read by load_prefix), so the order survives restarts. A prompt never evicts
//   its own pages: when the least recently used file is one of them, the page key being stored is
//   not stored (over_budget), so a prompt larger than the capacity keeps the leading run that fit.
//   A later page is useless without the pages before it, so a prompt's run is marked used last
//   page first: its tail goes before its head.
// - One process at a time: an exclusive flock on DIR/lock, taken by the constructor; the holder's
//   pid is written in it so that the error names it (prefix_store/folder.hpp). Thread-safe (one
//   mutex); reads and writes run in the caller's thread.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
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
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/prefix_store/file.hpp"
#include "kvdrive/tier/remote.hpp"

namespace kvdrive::tier {

class PrefixStore {
 public:
  struct Params {
    std::string dir{};                                       ///< the store's folder (made if missing; its parent must exist)
    PrefixDigest model{};                                    ///< what else decides the K/V (weights, RoPE, ...): required
    std::uint64_t capacity_bytes = std::uint64_t{8} << 30;   ///< bytes of .kvp files kept; least recently used go first
    std::size_t max_pending_bytes = std::size_t{256} << 20;  ///< pages waiting for their other layers
    bool sync = true;                                        ///< fdatasync each file and the folder (durable across power loss)
  };

  /// Opens (or makes) the folder and locks it for this process; throws kvdrive::Error if another
  /// store holds it, naming the holder's pid.
  explicit PrefixStore(Params p) : p_(std::move(p)) {
    KVD_EXPECT(!p_.dir.empty(), "PrefixStore: no folder given");
    KVD_EXPECT(p_.model.low != 0 || p_.model.high != 0, "PrefixStore {}: no model digest (Params::model): pages of different models would meet",
               p_.dir);
    KVD_EXPECT(p_.capacity_bytes > 0, "PrefixStore {}: capacity_bytes must be > 0", p_.dir);
    if (::mkdir(p_.dir.c_str(), 0700) != 0) KVD_EXPECT(errno == EEXIST, "PrefixStore: cannot make the folder {}: {}", p_.dir, std::strerror(errno));
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
               "PrefixStore {}: open needs the page size, layers and KV heads (got {} bytes, {} layers, {} heads)", p_.dir, g.page_bytes, g.layers,
               g.kv_heads);
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

  // ---- the page files (prefix_store/page_files.hpp) ---------------------------------------

  bool store(const PrefixDigest& key, const std::string& name, const Pending& pend, PageChain chain, std::set<std::string>& own);
  bool read_file(const PrefixDigest& key, std::span<const ReadRequest> reads, const std::vector<std::size_t>& which, std::vector<RemoteRead>& out);

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

  // ---- the folder (prefix_store/folder.hpp) -----------------------------------------------

  void lock();
  void scan();
  void sync_dir();

  Params p_;
  TierGeometry g_{};
  prefix_store::Fd lock_;
  std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();  // a unique_ptr so that a store can be moved
  std::map<std::string, Entry> entries_;                             // .kvp files by name
  std::set<std::pair<std::int64_t, std::string>> by_use_;            // (last use, name), least recent first
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

// PrefixStore's members defined outside the class, one header per purpose.
#include "kvdrive/tier/prefix_store/folder.hpp"
#include "kvdrive/tier/prefix_store/page_files.hpp"
