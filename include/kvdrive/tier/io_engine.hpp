// IoEngine: positioned reads of one file descriptor, many in flight. With liburing (Debian
// liburing-dev; KVD_HAVE_LIBURING) it drives an io_uring of `queue_depth` entries; where
// io_uring is missing or refused (old kernels, seccomp in containers) it falls back to a thread
// pool of pread() calls, and name() says which one runs. A read that returns fewer bytes than
// asked (end of file) or fails reports it in its own result; only a broken ring throws (after
// the reads it took have finished).
#pragma once

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/thread_pool.hpp"

#if KVD_HAVE_LIBURING
#include <liburing.h>
#endif

namespace kvdrive::tier {

/// One read: `len` bytes at `offset` into `buf`, or, when `iov` is set, scattered over the
/// `iov_count` buffers of `iov` (a readv; their lengths sum to `len`). `result` is the bytes
/// read or -errno.
struct IoRead {
  std::uint64_t offset = 0;
  std::size_t len = 0;
  std::byte* buf = nullptr;
  std::int64_t result = 0;
  const ::iovec* iov = nullptr;
  unsigned iov_count = 0;
};

enum class IoBackend { automatic, io_uring, threads };

class IoEngine {
 public:
  /// The most buffers one vectored read may name (Linux UIO_MAXIOV).
  static constexpr std::size_t kMaxIov = 1024;

  IoEngine() = default;
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;
  ~IoEngine() { close(); }

  /// want: automatic tries io_uring, then threads; io_uring fails if it is unavailable.
  void open(IoBackend want, unsigned queue_depth, unsigned threads) {
    close();
    KVD_EXPECT(queue_depth >= 1 && queue_depth <= 4096, "I/O queue depth {} outside 1..4096", queue_depth);
    depth_ = queue_depth;
#if KVD_HAVE_LIBURING
    if (want != IoBackend::threads) {
      ring_ = std::make_unique<io_uring>();
      const int rc = io_uring_queue_init(queue_depth, ring_.get(), 0);
      if (rc == 0) {
        backend_ = IoBackend::io_uring;
        return;
      }
      ring_.reset();
      KVD_EXPECT(want != IoBackend::io_uring, "io_uring is unavailable here ({}); use the thread backend", std::strerror(-rc));
    }
#else
    KVD_EXPECT(want != IoBackend::io_uring, "kvdrive was built without liburing; use the thread backend");
#endif
    backend_ = IoBackend::threads;
    pool_ = std::make_unique<ThreadPool>(threads ? threads : queue_depth < 16 ? queue_depth : 16);
  }

  void close() {
#if KVD_HAVE_LIBURING
    if (ring_) io_uring_queue_exit(ring_.get());  // unregisters the buffers too
    ring_.reset();
    regions_.clear();
    table_ready_ = table_failed_ = false;
#endif
    registered_bytes_ = 0;
    pool_.reset();
  }

  /// Registers [p, p + bytes) with io_uring once, so that reads into it skip the per-I/O
  /// pinning of user pages (IORING_OP_READ_FIXED). Returns false, changing nothing, where that
  /// is not possible: the thread backend, a kernel without sparse buffer tables, the locked
  /// memory limit, or a full table. Reads into memory that is not registered work as before.
  /// The memory must stay mapped while the engine is open (the kernel pins it meanwhile).
  bool register_memory(std::byte* p, std::size_t bytes) {
#if KVD_HAVE_LIBURING
    if (backend_ != IoBackend::io_uring || !ring_ || bytes == 0 || bytes > (std::size_t{1} << 30) || regions_.size() >= kMaxRegions)
      return false;
    if (!table_ready_) {
      if (table_failed_ || io_uring_register_buffers_sparse(ring_.get(), kMaxRegions) < 0) {
        table_failed_ = true;
        return false;
      }
      table_ready_ = true;
    }
    ::iovec iov{p, bytes};
    const auto index = static_cast<unsigned>(regions_.size());
    if (io_uring_register_buffers_update_tag(ring_.get(), index, &iov, nullptr, 1) < 0) return false;
    const Region r{p, bytes, index};
    regions_.insert(std::upper_bound(regions_.begin(), regions_.end(), r, [](const Region& a, const Region& b) { return a.base < b.base; }), r);
    registered_bytes_ += bytes;
    return true;
#else
    (void)p, (void)bytes;
    return false;
#endif
  }
  std::size_t registered_bytes() const { return registered_bytes_; }
  /// Reads issued as IORING_OP_READ_FIXED into registered memory.
  std::uint64_t fixed_reads() const { return fixed_reads_; }

  IoBackend backend() const { return backend_; }
  std::string_view name() const { return backend_ == IoBackend::io_uring ? "io_uring" : "threads (pread)"; }
  unsigned queue_depth() const { return depth_; }

  /// Runs every read to completion, at most queue_depth in flight.
  void read_all(int fd, std::span<IoRead> reads) {
#if KVD_HAVE_LIBURING
    if (backend_ == IoBackend::io_uring) return ring_read_all(fd, reads);
#endif
    pool_->parallel_for(reads.size(), [&](std::size_t i) { pread_full(fd, reads[i]); });
  }

 private:
  using IovArray = std::array<::iovec, kMaxIov>;

  /// The part of r's buffers that starts `done` bytes in (a partial vectored read resumes
  /// here); returns how many of `rest` it filled. Allocates nothing: it runs while reads are in
  /// flight.
  static unsigned resume_at(const IoRead& r, std::size_t done, IovArray& rest) {
    unsigned n = 0;
    std::size_t skip = done;
    for (unsigned i = 0; i < r.iov_count && n < rest.size(); ++i) {
      const ::iovec& v = r.iov[i];
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      rest[n++] = {static_cast<std::byte*>(v.iov_base) + skip, v.iov_len - skip};
      skip = 0;
    }
    return n;
  }

  static void pread_full(int fd, IoRead& r) {
    std::size_t done = 0;
    IovArray rest;
    while (done < r.len) {
      ssize_t n;
      if (r.iov) {
        const unsigned count = resume_at(r, done, rest);
        n = ::preadv(fd, rest.data(), static_cast<int>(count), static_cast<off_t>(r.offset + done));
      } else {
        n = ::pread(fd, r.buf + done, r.len - done, static_cast<off_t>(r.offset + done));
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        r.result = -errno;
        return;
      }
      if (n == 0) break;  // end of file: a short read
      done += static_cast<std::size_t>(n);
    }
    r.result = static_cast<std::int64_t>(done);
  }

#if KVD_HAVE_LIBURING
  void ring_read_all(int fd, std::span<IoRead> reads) {
    std::size_t next = 0, inflight = 0;  // inflight: queued or submitted, not yet completed
    IovArray tail;                       // the rest of a partial vectored read
    const auto reap = [&](io_uring_cqe* cqe) {
      IoRead& r = reads[io_uring_cqe_get_data64(cqe)];
      r.result = cqe->res;
      io_uring_cqe_seen(ring_.get(), cqe);
      --inflight;
      // A partial read (possible on some files) is finished synchronously.
      if (r.result > 0 && static_cast<std::size_t>(r.result) < r.len) {
        IoRead rest{r.offset + static_cast<std::uint64_t>(r.result), r.len - static_cast<std::size_t>(r.result), nullptr, 0};
        if (r.iov) {
          rest.iov = tail.data();
          rest.iov_count = resume_at(r, static_cast<std::size_t>(r.result), tail);
        } else {
          rest.buf = r.buf + r.result;
        }
        pread_full(fd, rest);
        r.result = rest.result < 0 ? rest.result : r.result + rest.result;
      }
    };
    while (next < reads.size() || inflight > 0) {
      while (next < reads.size() && inflight < depth_) {
        io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
        if (!sqe) break;
        IoRead& r = reads[next];
        if (r.iov) {
          io_uring_prep_readv(sqe, fd, r.iov, r.iov_count, r.offset);
        } else if (const Region* reg = region_of(r.buf, r.len)) {
          io_uring_prep_read_fixed(sqe, fd, r.buf, static_cast<unsigned>(r.len), r.offset, static_cast<int>(reg->index));
          ++fixed_reads_;
        } else {
          io_uring_prep_read(sqe, fd, r.buf, static_cast<unsigned>(r.len), r.offset);
        }
        io_uring_sqe_set_data64(sqe, next);
        ++next;
        ++inflight;
      }
      // Submits everything queued (a busy or interrupted submit is retried) and waits for one.
      const int rc = io_uring_submit_and_wait(ring_.get(), 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        // The ring is broken: let what it took finish (the kernel writes into our buffers), then fail.
        std::size_t taken = inflight - io_uring_sq_ready(ring_.get());
        while (taken > 0) {
          io_uring_cqe* cqe = nullptr;
          if (io_uring_wait_cqe(ring_.get(), &cqe) < 0) break;
          io_uring_cqe_seen(ring_.get(), cqe);
          --taken;
        }
        fail("io_uring submit failed: {}", std::strerror(-rc));
      }
      io_uring_cqe* cqe = nullptr;
      while (io_uring_peek_cqe(ring_.get(), &cqe) == 0 && cqe) reap(cqe);
    }
  }
  struct Region {
    std::byte* base;
    std::size_t bytes;
    unsigned index;  ///< in the ring's buffer table
  };
  /// The registered region holding [p, p + len), or null.
  const Region* region_of(const std::byte* p, std::size_t len) const {
    auto it = std::upper_bound(regions_.begin(), regions_.end(), p, [](const std::byte* x, const Region& r) { return x < r.base; });
    if (it == regions_.begin()) return nullptr;
    --it;
    return p + len <= it->base + it->bytes ? &*it : nullptr;
  }
  static constexpr unsigned kMaxRegions = 1024;
  std::unique_ptr<io_uring> ring_;
  std::vector<Region> regions_;  ///< sorted by base
  bool table_ready_ = false, table_failed_ = false;
#endif
  std::size_t registered_bytes_ = 0;
  std::uint64_t fixed_reads_ = 0;

  IoBackend backend_ = IoBackend::threads;
  unsigned depth_ = 1;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace kvdrive::tier
