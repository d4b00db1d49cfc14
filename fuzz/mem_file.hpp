// fuzz::MemFile: an SsdFile (tier/ssd/posix_file.hpp) over files kept in memory, so that
// fuzz_ssd_recover opens a damaged store thousands of times a second instead of a hundred (no
// disk, no syncs). Copies share one MemDisk, as the File seam asks. Syncs and locks succeed at
// once (one process); statx and io_uring are absent, so the store takes its defaults (4096-byte
// alignment) and must read with IoBackend::threads.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#if KVD_HAVE_LIBURING
#include <liburing.h>
#endif

#include "kvdrive/tier/ssd/posix_file.hpp"

namespace kvdrive::fuzz {

/// The files of a MemFile, by path.
struct MemDisk {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<std::vector<std::byte>>> files;
  std::map<int, std::shared_ptr<std::vector<std::byte>>> open;
  int next_fd = 3;

  /// A copy of every file (the open descriptors are not copied).
  std::shared_ptr<MemDisk> clone() {
    std::lock_guard lock(mu);
    auto d = std::make_shared<MemDisk>();
    for (const auto& [path, bytes] : files) d->files[path] = std::make_shared<std::vector<std::byte>>(*bytes);
    return d;
  }
  std::vector<std::byte>& file(const std::string& path) { return *files.at(path); }
};

class MemFile {
 public:
  explicit MemFile(std::shared_ptr<MemDisk> disk) : d_(std::move(disk)) {}

  int access(const char* path, int) {
    std::lock_guard lock(d_->mu);
    return d_->files.count(path) ? 0 : fail(ENOENT);
  }
  int open(const char* path, int flags, mode_t) {
    std::lock_guard lock(d_->mu);
    auto it = d_->files.find(path);
    if (it == d_->files.end()) {
      if (!(flags & O_CREAT)) return fail(ENOENT);
      it = d_->files.emplace(path, std::make_shared<std::vector<std::byte>>()).first;
    } else if (flags & O_TRUNC) {
      it->second->clear();
    }
    d_->open[d_->next_fd] = it->second;
    return d_->next_fd++;
  }
  int close(int fd) {
    std::lock_guard lock(d_->mu);
    return d_->open.erase(fd) ? 0 : fail(EBADF);
  }
  int unlink(const char* path) {
    std::lock_guard lock(d_->mu);
    return d_->files.erase(path) ? 0 : fail(ENOENT);
  }
  ssize_t pread(int fd, void* buf, std::size_t len, off_t offset) {
    const ::iovec v{buf, len};
    return preadv(fd, &v, 1, offset);
  }
  ssize_t preadv(int fd, const ::iovec* iov, int count, off_t offset) {
    std::lock_guard lock(d_->mu);
    const auto* f = file(fd);
    if (f == nullptr || offset < 0) return fail(f == nullptr ? EBADF : EINVAL);
    std::size_t at = static_cast<std::size_t>(offset), done = 0;
    for (int i = 0; i < count; ++i) {
      const std::size_t n = at >= f->size() ? 0 : std::min(iov[i].iov_len, f->size() - at);
      if (n > 0) std::memcpy(iov[i].iov_base, f->data() + at, n);
      at += n, done += n;
      if (n < iov[i].iov_len) break;
    }
    return static_cast<ssize_t>(done);
  }
  ssize_t pwrite(int fd, const void* buf, std::size_t len, off_t offset) {
    std::lock_guard lock(d_->mu);
    auto* f = file(fd);
    if (f == nullptr || offset < 0) return fail(f == nullptr ? EBADF : EINVAL);
    const std::size_t at = static_cast<std::size_t>(offset);
    if (f->size() < at + len) f->resize(at + len);
    if (len > 0) std::memcpy(f->data() + at, buf, len);
    return static_cast<ssize_t>(len);
  }
  int fdatasync(int fd) { return known(fd); }
  int fsync(int fd) { return known(fd); }
  int ftruncate(int fd, off_t size) {
    std::lock_guard lock(d_->mu);
    auto* f = file(fd);
    if (f == nullptr || size < 0) return fail(f == nullptr ? EBADF : EINVAL);
    f->resize(static_cast<std::size_t>(size));
    return 0;
  }
  int fstat(int fd, struct stat* st) {
    std::lock_guard lock(d_->mu);
    const auto* f = file(fd);
    if (f == nullptr) return fail(EBADF);
    *st = {};
    st->st_mode = S_IFREG | 0600;
    st->st_size = static_cast<off_t>(f->size());
    st->st_blksize = 4096;
    return 0;
  }
  int flock(int fd, int) { return known(fd); }
#ifdef STATX_DIOALIGN
  int statx(int, unsigned, struct statx*) { return fail(ENOSYS); }
#endif
#if KVD_HAVE_LIBURING
  int uring_init(unsigned, io_uring*) { return -ENOSYS; }
  int uring_register_sparse(io_uring*, unsigned) { return -ENOSYS; }
  int uring_register_update(io_uring*, unsigned, const ::iovec*) { return -ENOSYS; }
  int uring_submit(io_uring*, unsigned) { return -ENOSYS; }
  std::int64_t uring_result(int, std::uint64_t, std::size_t, std::int64_t res) { return res; }
#endif

 private:
  static int fail(int error) {
    errno = error;
    return -1;
  }
  std::vector<std::byte>* file(int fd) {
    const auto it = d_->open.find(fd);
    return it == d_->open.end() ? nullptr : it->second.get();
  }
  int known(int fd) {
    std::lock_guard lock(d_->mu);
    return file(fd) ? 0 : fail(EBADF);
  }

  std::shared_ptr<MemDisk> d_;
};

static_assert(tier::SsdFile<MemFile>);

}  // namespace kvdrive::fuzz
