// test::FaultFile: a File for BasicSsdTier (the seam of tier/ssd/posix_file.hpp) that passes
// every call to PosixFile, and can instead fail any one of them or cut the power, in the manner
// of LevelDB's FaultInjectionTestEnv. Its copies share one FaultDisk, which the test keeps:
//
//   auto disk = std::make_shared<test::FaultDisk>();
//   tier::BasicSsdTier<test::FaultFile> t(params, test::FaultFile(disk));
//   disk->fail(test::FileOp::fdatasync, 2);   // the second fdatasync from now fails (EIO)
//   disk->power_loss_after(7);                // the power goes at the 7th write or sync
//   disk->power_loss_at_sync(3, seed);        // ... at the 3rd sync, unsynced writes meeting seeded fates
//
// Power loss: the disk remembers each write since its file's last sync; when the power goes,
// they are undone, newest first, and the newest is then torn (its first half lands, as a
// device that was writing it would leave it); that call throws "simulated power loss", and
// every later call but close fails with EIO (reopen the store with another File). With
// power_loss_at_sync, each unsynced write instead meets a fate of its own: kept, dropped, torn
// at 512- or 4096-byte sectors, or replaced by garbage. A fail()ed
// call returns -1 with errno set (io_uring calls: -errno; a completion: its result -errno).
// flip_stored_bit flips a bit of a stored page on the medium, below the store's checksum.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/page_key.hpp"
#include "kvdrive/tier/ssd/posix_file.hpp"

namespace kvdrive::test {

/// The calls of the File seam, each of which a FaultDisk can fail.
enum class FileOp {
  access,
  open,
  close,
  unlink,
  pread,
  preadv,
  pwrite,
  fdatasync,
  fsync,
  ftruncate,
  fstat,
  statx,
  flock,
  uring_init,
  uring_register,
  uring_submit,
  uring_result,
  count_
};

class FaultDisk {
 public:
  FaultDisk() = default;
  FaultDisk(const FaultDisk&) = delete;
  FaultDisk& operator=(const FaultDisk&) = delete;
  ~FaultDisk() {
    for (const auto& [path, fd] : buffered_) real_.close(fd);
  }

  /// The n-th call of `op` from now (n >= 1) fails with `error`.
  void fail(FileOp op, std::uint64_t nth = 1, int error = EIO) {
    std::lock_guard lock(mu_);
    rules_[index(op)] = Rule{nth, false, error};
  }
  /// Every call of `op` from now fails with `error`, until heal().
  void fail_always(FileOp op, int error = EIO) {
    std::lock_guard lock(mu_);
    rules_[index(op)] = Rule{0, true, error};
  }
  void heal() {
    std::lock_guard lock(mu_);
    rules_ = {};
    short_countdown_ = 0;
  }
  /// The n-th pwrite from now (n >= 1) writes only part of its bytes (half, cut to 512-byte
  /// sectors) and returns that short count, as a write the kernel cut short.
  void short_write(std::uint64_t nth) {
    std::lock_guard lock(mu_);
    short_countdown_ = nth;
  }
  /// What a pwrite of `len` bytes writes: `len`, or less when a short write is due now.
  std::size_t write_length(std::size_t len) {
    std::lock_guard lock(mu_);
    if (short_countdown_ == 0 || --short_countdown_ > 0) return len;
    ++injected_;
    return len > 512 ? len / 2 / 512 * 512 : len / 2;
  }
  /// Calls of `op` so far (failed ones included).
  std::uint64_t calls(FileOp op) const {
    std::lock_guard lock(mu_);
    return calls_[index(op)];
  }
  std::uint64_t injected() const {
    std::lock_guard lock(mu_);
    return injected_;
  }

  /// The power goes at the n-th write or sync from now (n >= 1).
  void power_loss_after(std::uint64_t n) {
    std::lock_guard lock(mu_);
    KVD_EXPECT(n >= 1, "power_loss_after: n must be >= 1");
    countdown_ = n;
    sync_only_ = fates_on_ = false;
    unsynced_.clear();
  }
  /// The power goes at the n-th fdatasync or fsync from now (n >= 1), before it takes effect.
  /// Each write since its file's last sync then meets a fate drawn from `fate_seed`, oldest
  /// first, as a device's volatile cache may leave it: kept, dropped, torn at 512-byte or at
  /// 4096-byte sectors (each sector of the write lands or not), or replaced by garbage.
  void power_loss_at_sync(std::uint64_t n, std::uint64_t fate_seed) {
    std::lock_guard lock(mu_);
    KVD_EXPECT(n >= 1, "power_loss_at_sync: n must be >= 1");
    countdown_ = n;
    sync_only_ = fates_on_ = true;
    fate_seed_ = fate_seed;
    unsynced_.clear();
  }
  /// The fates dealt so far by power_loss_at_sync.
  struct Fates {
    std::uint64_t kept = 0, dropped = 0, torn_512 = 0, torn_4096 = 0, garbage = 0;
  };
  Fates fates() const {
    std::lock_guard lock(mu_);
    return fates_;
  }
  bool power_out() const {
    std::lock_guard lock(mu_);
    return out_;
  }

  /// Flips bit `bit` (0..7) of the byte at `offset` of the file, and syncs it.
  static void flip_bit(const std::string& path, std::uint64_t offset, unsigned bit) {
    tier::PosixFile f;
    const int fd = f.open(path.c_str(), O_RDWR | O_CLOEXEC, 0);
    KVD_EXPECT(fd >= 0, "flip_bit: cannot open {}", path);
    unsigned char c = 0;
    const bool ok = f.pread(fd, &c, 1, static_cast<off_t>(offset)) == 1 &&
                    (c = static_cast<unsigned char>(c ^ (1u << bit)), f.pwrite(fd, &c, 1, static_cast<off_t>(offset)) == 1) && f.fdatasync(fd) == 0;
    f.close(fd);
    KVD_EXPECT(ok, "flip_bit: cannot flip a bit at byte {} of {}", offset, path);
  }

  // ---- what FaultFile asks (each returns 0, or the errno the call fails with) ----------------

  int check(FileOp op) {
    std::lock_guard lock(mu_);
    return check_locked(op);
  }
  void opened(int fd, const char* path) {
    std::lock_guard lock(mu_);
    paths_[fd] = path;
  }
  void closed(int fd) {
    std::lock_guard lock(mu_);
    paths_.erase(fd);
  }
  /// Before a write: the power may go now (throws); else the write is remembered as unsynced.
  int before_write(int fd, const void* buf, std::size_t len, off_t offset) {
    std::lock_guard lock(mu_);
    if (const int e = check_locked(FileOp::pwrite)) return e;
    if (countdown_ == 0) return 0;
    if (!sync_only_) tick(fd);
    remember(fd, static_cast<const std::byte*>(buf), len, static_cast<std::uint64_t>(offset));
    return 0;
  }
  /// Before a sync: the power may go now (throws); else the file's writes are durable.
  int before_sync(int fd, FileOp op) {
    std::lock_guard lock(mu_);
    if (const int e = check_locked(op)) return e;
    if (countdown_ == 0) return 0;
    tick(fd);
    const std::string& path = paths_[fd];
    std::erase_if(unsynced_, [&](const Unsynced& u) { return u.path == path; });
    return 0;
  }

 private:
  struct Rule {
    std::uint64_t countdown = 0;  ///< fails when it reaches 0 from 1 (0: no rule)
    bool always = false;
    int error = EIO;
  };
  struct Unsynced {
    std::string path;
    std::uint64_t offset, old_size;
    std::vector<std::byte> before, after;
  };

  static std::size_t index(FileOp op) { return static_cast<std::size_t>(op); }

  int check_locked(FileOp op) {
    ++calls_[index(op)];
    if (out_ && op != FileOp::close) return EIO;
    Rule& r = rules_[index(op)];
    if (!r.always && (r.countdown == 0 || --r.countdown > 0)) return 0;
    ++injected_;
    return r.error;
  }

  /// Counts one write or sync; at the chosen one the power goes.
  void tick(int fd) {
    if (countdown_ > 1) {
      --countdown_;
      return;
    }
    countdown_ = 0;
    for (auto it = unsynced_.rbegin(); it != unsynced_.rend(); ++it) {  // newest first
      raw_write(it->path, it->before.data(), it->before.size(), it->offset);
      real_.ftruncate(buffered(it->path), static_cast<off_t>(it->old_size));
    }
    if (fates_on_) {
      deal_fates();
    } else if (!unsynced_.empty()) {
      const Unsynced& last = unsynced_.back();
      const std::size_t half = last.after.size() / 2 / 512 * 512;
      raw_write(last.path, last.after.data(), std::max<std::size_t>(half, 256), last.offset);
    }
    unsynced_.clear();
    out_ = true;
    ::kvdrive::fail("SsdTier {}: simulated power loss", paths_[fd]);
  }

  /// Lands each unsynced write (undone by now) as its fate says, oldest first.
  void deal_fates() {
    std::mt19937_64 rng(fate_seed_);
    for (const Unsynced& u : unsynced_) {
      switch (rng() % 5) {
        case 0:
          raw_write(u.path, u.after.data(), u.after.size(), u.offset);
          ++fates_.kept;
          break;
        case 1: ++fates_.dropped; break;
        case 2:
        case 3: {  // torn: each sector of the write (at the file's sector boundaries) lands or not
          const std::uint64_t sector = rng() % 2 ? 512 : 4096;
          ++(sector == 512 ? fates_.torn_512 : fates_.torn_4096);
          for (std::uint64_t at = u.offset; at < u.offset + u.after.size();) {
            const std::uint64_t end = std::min<std::uint64_t>((at / sector + 1) * sector, u.offset + u.after.size());
            if (rng() % 2) raw_write(u.path, u.after.data() + (at - u.offset), end - at, at);
            at = end;
          }
          break;
        }
        default: {
          std::vector<std::byte> junk(u.after.size());
          for (auto& b : junk) b = static_cast<std::byte>(rng());
          raw_write(u.path, junk.data(), junk.size(), u.offset);
          ++fates_.garbage;
        }
      }
    }
  }

  void remember(int fd, const std::byte* buf, std::size_t len, std::uint64_t offset) {
    Unsynced u{paths_[fd], offset, 0, {}, std::vector<std::byte>(buf, buf + len)};
    struct stat st {};
    real_.fstat(fd, &st);
    u.old_size = static_cast<std::uint64_t>(st.st_size);
    const std::uint64_t end = std::min<std::uint64_t>(offset + len, u.old_size);
    if (end > offset) {
      u.before.resize(end - offset);
      (void)!real_.pread(buffered(u.path), u.before.data(), u.before.size(), static_cast<off_t>(offset));
    }
    unsynced_.push_back(std::move(u));
  }

  /// A buffered descriptor of the file (the store's may be O_DIRECT; these writes are unaligned).
  int buffered(const std::string& path) {
    auto [it, fresh] = buffered_.try_emplace(path, -1);
    if (fresh) it->second = real_.open(path.c_str(), O_RDWR | O_CLOEXEC, 0);
    return it->second;
  }
  void raw_write(const std::string& path, const std::byte* buf, std::size_t len, std::uint64_t offset) {
    if (len > 0) (void)!real_.pwrite(buffered(path), buf, len, static_cast<off_t>(offset));
  }

  mutable std::mutex mu_;
  tier::PosixFile real_;
  std::array<Rule, static_cast<std::size_t>(FileOp::count_)> rules_{};
  std::array<std::uint64_t, static_cast<std::size_t>(FileOp::count_)> calls_{};
  std::uint64_t injected_ = 0;
  std::map<int, std::string> paths_;  ///< the store's open descriptors
  std::map<std::string, int> buffered_;
  std::uint64_t countdown_ = 0;        ///< writes and syncs left before the power goes (0: it does not)
  std::uint64_t short_countdown_ = 0;  ///< pwrites left before one is cut short (0: none)
  std::vector<Unsynced> unsynced_;
  bool sync_only_ = false, fates_on_ = false;  ///< power_loss_at_sync
  std::uint64_t fate_seed_ = 0;
  Fates fates_;
  bool out_ = false;
};

class FaultFile {
 public:
  FaultFile() : FaultFile(std::make_shared<FaultDisk>()) {}
  explicit FaultFile(std::shared_ptr<FaultDisk> disk) : disk_(std::move(disk)) {}
  FaultDisk& disk() const { return *disk_; }

  int access(const char* path, int mode) {
    return guard(FileOp::access, [&] { return real_.access(path, mode); });
  }
  int open(const char* path, int flags, mode_t mode) {
    const int fd = guard(FileOp::open, [&] { return real_.open(path, flags, mode); });
    if (fd >= 0) disk_->opened(fd, path);
    return fd;
  }
  int close(int fd) {  // the descriptor goes even when the call fails
    disk_->closed(fd);
    const int e = disk_->check(FileOp::close);
    const int rc = real_.close(fd);
    return e ? refuse<int>(e) : rc;
  }
  int unlink(const char* path) {
    return guard(FileOp::unlink, [&] { return real_.unlink(path); });
  }
  ssize_t pread(int fd, void* buf, std::size_t len, off_t offset) {
    return guard(FileOp::pread, [&] { return real_.pread(fd, buf, len, offset); });
  }
  ssize_t preadv(int fd, const ::iovec* iov, int count, off_t offset) {
    return guard(FileOp::preadv, [&] { return real_.preadv(fd, iov, count, offset); });
  }
  ssize_t pwrite(int fd, const void* buf, std::size_t len, off_t offset) {
    if (const int e = disk_->before_write(fd, buf, len, offset)) return refuse<ssize_t>(e);
    return real_.pwrite(fd, buf, disk_->write_length(len), offset);
  }
  int fdatasync(int fd) {
    if (const int e = disk_->before_sync(fd, FileOp::fdatasync)) return refuse<int>(e);
    return real_.fdatasync(fd);
  }
  int fsync(int fd) {
    if (const int e = disk_->before_sync(fd, FileOp::fsync)) return refuse<int>(e);
    return real_.fsync(fd);
  }
  int ftruncate(int fd, off_t size) {
    return guard(FileOp::ftruncate, [&] { return real_.ftruncate(fd, size); });
  }
  int fstat(int fd, struct stat* st) {
    return guard(FileOp::fstat, [&] { return real_.fstat(fd, st); });
  }
  int flock(int fd, int operation) {
    return guard(FileOp::flock, [&] { return real_.flock(fd, operation); });
  }
#ifdef STATX_DIOALIGN
  int statx(int fd, unsigned mask, struct statx* sx) {
    return guard(FileOp::statx, [&] { return real_.statx(fd, mask, sx); });
  }
#endif

#if KVD_HAVE_LIBURING
  int uring_init(unsigned entries, io_uring* ring) {
    return uring_guard(FileOp::uring_init, [&] { return real_.uring_init(entries, ring); });
  }
  int uring_register_sparse(io_uring* ring, unsigned entries) {
    return uring_guard(FileOp::uring_register, [&] { return real_.uring_register_sparse(ring, entries); });
  }
  int uring_register_update(io_uring* ring, unsigned index, const ::iovec* iov) {
    return uring_guard(FileOp::uring_register, [&] { return real_.uring_register_update(ring, index, iov); });
  }
  int uring_submit(io_uring* ring, unsigned wait_nr) {
    return uring_guard(FileOp::uring_submit, [&] { return real_.uring_submit(ring, wait_nr); });
  }
  std::int64_t uring_result(int fd, std::uint64_t offset, std::size_t len, std::int64_t res) {
    const int e = disk_->check(FileOp::uring_result);
    return e ? -e : real_.uring_result(fd, offset, len, res);
  }
#endif

 private:
  template <class R>
  static R refuse(int error) {
    errno = error;
    return R{-1};
  }
  template <class Call>
  auto guard(FileOp op, Call&& call) -> decltype(call()) {
    if (const int e = disk_->check(op)) return refuse<decltype(call())>(e);
    return call();
  }
  template <class Call>
  int uring_guard(FileOp op, Call&& call) {
    const int e = disk_->check(op);
    return e ? -e : call();
  }

  std::shared_ptr<FaultDisk> disk_;
  tier::PosixFile real_;
};
static_assert(tier::SsdFile<FaultFile>);

/// Flips one bit of a stored page of a store (any BasicSsdTier) on the medium, below its
/// checksum, as a failing device would.
template <class Store>
void flip_stored_bit(const Store& store, const tier::PageKey& key, std::size_t bit) {
  KVD_EXPECT(bit < store.slot_bytes() * 8, "flip_stored_bit: bit {} outside a {}-byte slot", bit, store.slot_bytes());
  FaultDisk::flip_bit(store.path(), store.slot_offset(store.slot_of(key)) + bit / 8, static_cast<unsigned>(bit % 8));
}

}  // namespace kvdrive::test
