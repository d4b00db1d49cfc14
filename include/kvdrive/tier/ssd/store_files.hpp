// ssd::StoreFiles<File>: the two files of a store (PATH and PATH.log) and every operation on
// them, made through the File seam (posix_file.hpp): opening with O_DIRECT where the file system
// allows it, the direct-I/O alignment (statx), whole writes, syncs, sizes, cutting a file, the
// header blocks (ssd_format::Header) and the directory sync that makes new files durable. Errors
// throw kvdrive::Error naming the file.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/io_engine.hpp"
#include "kvdrive/tier/page_key.hpp"
#include "kvdrive/tier/ssd/layout.hpp"
#include "kvdrive/tier/ssd/posix_file.hpp"
#include "kvdrive/tier/ssd_format.hpp"

namespace kvdrive::tier::ssd {

template <SsdFile File>
class StoreFiles {
 public:
  explicit StoreFiles(File file) : file_(std::move(file)) {}
  StoreFiles(const StoreFiles&) = delete;
  StoreFiles& operator=(const StoreFiles&) = delete;
  ~StoreFiles() { close(); }

  /// Closes the files, then lets the lock go.
  void close() noexcept {
    for (int* fd : {&data_, &log_})
      if (*fd >= 0) {
        file_.close(*fd);
        *fd = -1;
      }
    unlock();
  }

  File& file() { return file_; }
  const File& file() const { return file_; }
  bool exists(const std::string& path) { return file_.access(path.c_str(), F_OK) == 0; }

  /// Takes the store's lock, PATH.lock (made 0600 beside the files; it stays there, empty while no
  /// writer holds it): exclusive for a writer, shared for a read-only open. A flock lock belongs
  /// to one open file description, so a second open of the store fails in the same process as in
  /// another. The writer records its pid in the lock file, and the error names the holder.
  void lock(const std::string& path, bool shared) {
    if (lock_ >= 0) return;
    const std::string name = path + ".lock";
    lock_ = file_.open(name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_ < 0 && shared && (errno == EACCES || errno == EROFS)) {  // inspecting a store in a folder we cannot write
      lock_ = file_.open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
      if (lock_ < 0 && errno == ENOENT) return;  // no writer has ever held it
    }
    KVD_EXPECT(lock_ >= 0, "SsdTier {}: cannot open the lock file {}: {}", path, name, std::strerror(errno));
    int rc;
    while ((rc = file_.flock(lock_, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
      const int error = errno;
      const std::string holder = holder_of_lock();
      file_.close(lock_);
      lock_ = -1;
      KVD_EXPECT(error == EWOULDBLOCK, "SsdTier {}: cannot lock {}: {}", path, name, std::strerror(error));
      fail("SsdTier {}: the store is in use {}; one process at a time may write a store (lock file {})", path, holder, name);
    }
    writer_ = !shared;
    if (writer_) {  // best effort: the pid only names the holder in others' errors
      const std::string pid = fmt::format("{}\n", ::getpid());
      if (file_.ftruncate(lock_, 0) == 0) (void)file_.pwrite(lock_, pid.data(), pid.size(), 0);
    }
  }

  /// Each of the store's files that exists must be empty or a kvdrive store's (its magic): then
  /// they are deleted. Anything else is left alone, with an error naming it. Hold the lock.
  void remove_store(const std::string& path) {
    for (const std::string& name : {path, path + ".log"}) {
      if (!exists(name)) continue;
      KVD_EXPECT(is_store_or_empty(name), "SsdTier: {} is not a kvdrive store; it is not deleted", name);
    }
    for (const std::string& name : {path, path + ".log"})
      KVD_EXPECT(file_.unlink(name.c_str()) == 0 || errno == ENOENT, "SsdTier: cannot delete {}: {}", name, std::strerror(errno));
  }

  /// True if the file is empty or begins with a kvdrive store's magic (its data file's or its log's).
  bool is_store_or_empty(const std::string& name) {
    const int fd = file_.open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return false;
    ssd_format::Header h;
    const ssize_t n = file_.pread(fd, &h, sizeof h, 0);
    file_.close(fd);
    if (n == 0) return true;
    return n == static_cast<ssize_t>(sizeof h) &&
           (std::memcmp(h.magic, ssd_format::kDataMagic, 8) == 0 || std::memcmp(h.magic, ssd_format::kLogMagic, 8) == 0);
  }

  /// Deletes the data file and the log, errors ignored (a scratch store closing; hold the lock).
  void unlink_store(const std::string& path) noexcept {
    (void)file_.unlink(path.c_str());
    (void)file_.unlink((path + ".log").c_str());
  }

  /// Opens the data file, then the log (each made when it is not `existing`; read-only opens
  /// neither make nor write them).
  void open(const std::string& path, bool data_exists, bool log_exists, bool direct_io, bool read_only = false) {
    data_ = open_file(path, data_exists, direct_io, read_only);
    log_ = open_file(path + ".log", log_exists, direct_io, read_only);
  }
  bool is_open() const { return data_ >= 0; }
  int data() const { return data_; }
  int log() const { return log_; }
  bool direct() const { return direct_; }

  /// The data file's direct-I/O alignment: statx STATX_DIOALIGN, else 4096.
  std::size_t dio_alignment() {
#ifdef STATX_DIOALIGN
    struct statx sx {};
    if (file_.statx(data_, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align > 0)
      return std::max<std::size_t>({sx.stx_dio_offset_align, sx.stx_dio_mem_align, 512});
#endif
    return 4096;
  }

  /// Writes all of buf at offset; `key` names the page in the error (the disk full, or another).
  void write_all(int fd, const std::byte* buf, std::size_t len, std::uint64_t offset, const std::string& name, const PageKey& key) {
    std::size_t done = 0;
    while (done < len) {
      const ssize_t n = file_.pwrite(fd, buf + done, len - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == ENOSPC) fail("SsdTier {}: the disk is full (writing page {}); the pages stored before stay readable", name, key);
      KVD_EXPECT(n > 0, "SsdTier {}: write error at page {}: {}", name, key, n < 0 ? std::strerror(errno) : "no progress");
      done += static_cast<std::size_t>(n);
    }
  }

  void datasync(int fd, const std::string& name) {
    KVD_EXPECT(file_.fdatasync(fd) == 0, "SsdTier {}: fdatasync failed: {}", name, std::strerror(errno));
  }

  std::uint64_t size(int fd, const std::string& name) {
    struct stat st {};
    KVD_EXPECT(file_.fstat(fd, &st) == 0, "{}: stat failed: {}", name, std::strerror(errno));
    return static_cast<std::uint64_t>(st.st_size);
  }

  /// Cuts the file to `bytes` and syncs it; false (errno set) if either fails.
  bool cut(int fd, std::uint64_t bytes) { return file_.ftruncate(fd, static_cast<off_t>(bytes)) == 0 && file_.fdatasync(fd) == 0; }

  /// Writes a file's header block and syncs it.
  void write_header(int fd, const char (&magic)[8], const Layout& l, const std::string& name) {
    ssd_format::Header h;
    std::memcpy(h.magic, magic, 8);
    h.alignment = static_cast<std::uint32_t>(l.align);
    h.page_bytes = l.page_bytes;
    h.slot_bytes = l.slot_bytes;
    h.checksum = h.compute_checksum();
    AlignedBuffer block;
    std::byte* buf = block.get(l.align, l.align);
    std::memset(buf, 0, l.align);
    std::memcpy(buf, &h, sizeof h);
    write_all(fd, buf, l.align, 0, name, PageKey{});
    datasync(fd, name);
  }

  /// Reads a file's header block (`align` bytes) and checks its magic, checksum, version and
  /// page size.
  ssd_format::Header read_header(int fd, const char (&magic)[8], std::size_t align, std::size_t page_bytes, const std::string& name) {
    AlignedBuffer block;
    std::byte* buf = block.get(align, align);
    IoRead r{0, align, buf, 0};
    read_once(fd, r);
    KVD_EXPECT(r.result >= static_cast<std::int64_t>(sizeof(ssd_format::Header)), "{} is not a kvdrive store (too short: {} bytes)", name,
               r.result < 0 ? 0 : r.result);
    ssd_format::Header h;
    std::memcpy(&h, buf, sizeof h);
    KVD_EXPECT(std::memcmp(h.magic, magic, 8) == 0 && h.checksum == h.compute_checksum(), "{} is not a kvdrive store (bad header)", name);
    KVD_EXPECT(h.version >= ssd_format::kOldestVersion && h.version <= ssd_format::kVersion,
               "{}: store format version {}, this build reads versions {} to {}", name, h.version, ssd_format::kOldestVersion, ssd_format::kVersion);
    KVD_EXPECT(h.page_bytes == page_bytes, "{}: a store of {}-byte pages, opened for {}-byte pages (another model shape or page size)", name,
               h.page_bytes, page_bytes);
    return h;
  }

  /// One read, run to completion (the result in r.result), outside the tier's own engine.
  void read_once(int fd, IoRead& r) {
    BasicIoEngine<File> once(file_);
    once.open(IoBackend::threads, 1, 1);
    once.read_all(fd, std::span<IoRead>(&r, 1));
  }

  /// Makes the files' directory entries durable (best effort).
  void sync_directory(const std::string& path) {
    const std::size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    const int fd = file_.open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0) return;
    file_.fsync(fd);
    file_.close(fd);
  }

 private:
  int open_file(const std::string& path, bool existing, bool direct_io, bool read_only) {
    const int flags = (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC | (existing ? 0 : O_CREAT | O_EXCL);
    constexpr mode_t kMode = 0600;  // a store holds a user's documents' K/V: for its owner only
    int fd = -1;
    if (direct_io) {
      fd = file_.open(path.c_str(), flags | O_DIRECT, kMode);
      if (fd < 0 && errno == EINVAL) {  // the file system refuses O_DIRECT (tmpfs): buffered I/O
        fd = file_.open(path.c_str(), flags, kMode);
        direct_ = false;
      } else {
        direct_ = fd >= 0;
      }
    } else {
      fd = file_.open(path.c_str(), flags, kMode);
      direct_ = false;
    }
    KVD_EXPECT(fd >= 0, "SsdTier: cannot open {}: {}", path, std::strerror(errno));
    return fd;
  }

  /// "by process N", "by this process ...", or "by a read-only open" from the lock file.
  std::string holder_of_lock() {
    char text[32] = {};
    const ssize_t n = file_.pread(lock_, text, sizeof text - 1, 0);
    const long pid = n > 0 ? std::strtol(text, nullptr, 10) : 0;
    if (pid <= 0) return "by a read-only open (or a writer just starting)";
    if (pid == ::getpid()) return fmt::format("by this process (pid {}): another SsdTier has it open", pid);
    return fmt::format("by process {}", pid);
  }

  /// Clears the pid (a writer's) and lets the lock go.
  void unlock() noexcept {
    if (lock_ < 0) return;
    if (writer_) (void)file_.ftruncate(lock_, 0);
    file_.close(lock_);
    lock_ = -1;
  }

  [[no_unique_address]] File file_;
  int data_ = -1, log_ = -1, lock_ = -1;
  bool direct_ = false, writer_ = false;
};

}  // namespace kvdrive::tier::ssd
