// tier::PosixFile: the seam between SsdTier (and the IoEngine that reads for it) and the
// operating system. Every file operation the store makes is a call of one of these members:
// a test puts its own File in (BasicSsdTier<File>, BasicIoEngine<File>) to fail, record or change
// any one call (tests/fault_file.hpp simulates power loss that way). PosixFile is the real one:
// each member is the system call (or liburing call) of the same name and returns what that
// returns: -1 with errno set on failure, or -errno for the io_uring members. It has no state;
// a File with state must share it between copies (the tier hands copies to its I/O engines).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <concepts>
#include <cstddef>
#include <cstdint>

#if KVD_HAVE_LIBURING
#include <liburing.h>
#endif

namespace kvdrive::tier {

struct PosixFile {
  int access(const char* path, int mode) { return ::access(path, mode); }
  int open(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }
  int close(int fd) { return ::close(fd); }
  int unlink(const char* path) { return ::unlink(path); }
  ssize_t pread(int fd, void* buf, std::size_t len, off_t offset) { return ::pread(fd, buf, len, offset); }
  ssize_t preadv(int fd, const ::iovec* iov, int count, off_t offset) { return ::preadv(fd, iov, count, offset); }
  ssize_t pwrite(int fd, const void* buf, std::size_t len, off_t offset) { return ::pwrite(fd, buf, len, offset); }
  int fdatasync(int fd) { return ::fdatasync(fd); }
  int fsync(int fd) { return ::fsync(fd); }
  int ftruncate(int fd, off_t size) { return ::ftruncate(fd, size); }
  int fstat(int fd, struct stat* st) { return ::fstat(fd, st); }
  int flock(int fd, int operation) { return ::flock(fd, operation); }
#ifdef STATX_DIOALIGN
  int statx(int fd, unsigned mask, struct statx* sx) { return ::statx(fd, "", AT_EMPTY_PATH, mask, sx); }
#endif

#if KVD_HAVE_LIBURING
  int uring_init(unsigned entries, io_uring* ring) { return io_uring_queue_init(entries, ring, 0); }
  int uring_register_sparse(io_uring* ring, unsigned entries) { return io_uring_register_buffers_sparse(ring, entries); }
  int uring_register_update(io_uring* ring, unsigned index, const ::iovec* iov) {
    return io_uring_register_buffers_update_tag(ring, index, iov, nullptr, 1);
  }
  /// Submits what is queued; with wait_nr > 0 also waits for that many completions.
  int uring_submit(io_uring* ring, unsigned wait_nr) { return wait_nr ? io_uring_submit_and_wait(ring, wait_nr) : io_uring_submit(ring); }
  /// The result of one completed read of `len` bytes at `offset` of fd (bytes read, or -errno),
  /// as the engine will take it.
  std::int64_t uring_result(int /*fd*/, std::uint64_t /*offset*/, std::size_t /*len*/, std::int64_t res) { return res; }
#endif
};

/// What BasicSsdTier and BasicIoEngine need of a File: PosixFile's members, and copies.
template <class F>
concept SsdFile = std::copy_constructible<F> &&
    requires(F& f, const char* path, int fd, void* buf, const void* cbuf, const ::iovec* iov, struct stat* st) {
  { f.access(path, 0) } -> std::same_as<int>;
  { f.open(path, 0, mode_t{}) } -> std::same_as<int>;
  { f.close(fd) } -> std::same_as<int>;
  { f.unlink(path) } -> std::same_as<int>;
  { f.pread(fd, buf, std::size_t{}, off_t{}) } -> std::same_as<ssize_t>;
  { f.preadv(fd, iov, 0, off_t{}) } -> std::same_as<ssize_t>;
  { f.pwrite(fd, cbuf, std::size_t{}, off_t{}) } -> std::same_as<ssize_t>;
  { f.fdatasync(fd) } -> std::same_as<int>;
  { f.fsync(fd) } -> std::same_as<int>;
  { f.ftruncate(fd, off_t{}) } -> std::same_as<int>;
  { f.fstat(fd, st) } -> std::same_as<int>;
  { f.flock(fd, 0) } -> std::same_as<int>;
};
static_assert(SsdFile<PosixFile>);

}  // namespace kvdrive::tier
