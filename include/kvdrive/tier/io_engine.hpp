// IoEngine: positioned reads, many in flight, in batches started and finished apart (start()
// returns with the reads in flight; finish() waits for one batch's). With liburing (Debian
// liburing-dev; KVD_HAVE_LIBURING) it drives an io_uring of `queue_depth` entries; where
// io_uring is missing or refused (old kernels, seccomp in containers) it falls back to a thread
// pool of pread() calls, and name() says which one runs. A read that returns fewer bytes than
// asked (end of file) or fails reports it in its own result; only a broken ring throws (after
// the reads it took have finished). Every call it makes to the system (preads, the ring's setup,
// registrations and submissions, each completion's result) goes through its File
// (tier/ssd/posix_file.hpp), so a test can fail any one of them.
#pragma once

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "kvdrive/tier/ssd/posix_file.hpp"

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

/// Identifies a started batch of reads (IoEngine::start); 0 is never one.
using IoToken = std::uint64_t;

template <SsdFile File = PosixFile>
class BasicIoEngine {
 public:
  /// The most buffers one vectored read may name (Linux UIO_MAXIOV).
  static constexpr std::size_t kMaxIov = 1024;

  explicit BasicIoEngine(File file = File()) : file_(std::move(file)) {}
  BasicIoEngine(const BasicIoEngine&) = delete;
  BasicIoEngine& operator=(const BasicIoEngine&) = delete;
  ~BasicIoEngine() { close(); }

  /// want: automatic tries io_uring, then threads; io_uring fails if it is unavailable.
  void open(IoBackend want, unsigned queue_depth, unsigned threads) {
    close();
    KVD_EXPECT(queue_depth >= 1 && queue_depth <= 4096, "I/O queue depth {} outside 1..4096", queue_depth);
    depth_ = queue_depth;
#if KVD_HAVE_LIBURING
    if (want != IoBackend::threads) {
      ring_ = std::make_unique<io_uring>();
      const int rc = file_.uring_init(queue_depth, ring_.get());
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
    pool_ = std::make_unique<ThreadPool>(threads            ? threads
                                         : queue_depth < 16 ? queue_depth
                                                            : 16,
                                         std::chrono::microseconds{0});  // they block in pread: no polling
  }

  void close() {
#if KVD_HAVE_LIBURING
    if (ring_) drain();                           // reads in flight write into callers' buffers
    if (ring_) io_uring_queue_exit(ring_.get());  // unregisters the buffers too
    pending_.clear();
    inflight_ = 0;
    ring_.reset();
    regions_.clear();
    table_ready_ = table_failed_ = false;
#endif
    registered_bytes_ = 0;
    pool_.reset();
    jobs_.clear();
    broken_ = false;
  }

  /// Registers [p, p + bytes) with io_uring once, so that reads into it skip the per-I/O
  /// pinning of user pages (IORING_OP_READ_FIXED). Returns false, changing nothing, where that
  /// is not possible: the thread backend, a kernel without sparse buffer tables, the locked
  /// memory limit, or a full table. Reads into memory that is not registered work as before.
  /// The memory must stay mapped while the engine is open (the kernel pins it meanwhile).
  bool register_memory(std::byte* p, std::size_t bytes) {
#if KVD_HAVE_LIBURING
    if (backend_ != IoBackend::io_uring || !ring_ || bytes == 0 || bytes > (std::size_t{1} << 30) || regions_.size() >= kMaxRegions) return false;
    if (!table_ready_) {
      if (table_failed_ || file_.uring_register_sparse(ring_.get(), kMaxRegions) < 0) {
        table_failed_ = true;
        return false;
      }
      table_ready_ = true;
    }
    ::iovec iov{p, bytes};
    const auto index = static_cast<unsigned>(regions_.size());
    if (file_.uring_register_update(ring_.get(), index, &iov) < 0) return false;
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

  /// Starts the reads and returns at once: with io_uring they are in flight on return (up to
  /// queue_depth over every started batch; the rest follow as slots free up). The reads and
  /// their buffers must stay put until finish(token). The thread backend runs them in finish().
  IoToken start(int fd, std::span<IoRead> reads) {
    KVD_EXPECT(!broken_, "I/O engine unusable after an io_uring failure");
    const IoToken t = ++tokens_;
    KVD_EXPECT(reads.size() < kMaxReadsPerToken, "I/O engine: {} reads in one batch, at most {}", reads.size(), kMaxReadsPerToken);
    Job& job = jobs_[t];
    job.fd = fd;
    job.reads = reads;
#if KVD_HAVE_LIBURING
    if (backend_ == IoBackend::io_uring && !reads.empty()) {
      pending_.push_back(t);
      push(false);
    }
#endif
    return t;
  }

  /// Waits until every read of `token` has finished (each with its own result). Throws only if
  /// the ring broke (after every read it took has finished).
  void finish(IoToken token) {
    auto it = jobs_.find(token);
    KVD_EXPECT(it != jobs_.end(), "I/O engine: unknown token {}", token);
#if KVD_HAVE_LIBURING
    if (backend_ == IoBackend::io_uring) {
      while (it->second.next < it->second.reads.size() || it->second.outstanding > 0) push(true);
      jobs_.erase(it);
      return;
    }
#endif
    const std::span<IoRead> reads = it->second.reads;
    const int fd = it->second.fd;
    jobs_.erase(it);
    pool_->parallel_for(reads.size(), [&](std::size_t i) { pread_full(fd, reads[i]); });
  }

  /// Runs every read to completion, at most queue_depth in flight.
  void read_all(int fd, std::span<IoRead> reads) { finish(start(fd, reads)); }

  /// Batches started and not yet finished.
  std::size_t unfinished() const { return jobs_.size(); }

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

  void pread_full(int fd, IoRead& r) {
    std::size_t done = 0;
    IovArray rest;
    while (done < r.len) {
      ssize_t n;
      if (r.iov) {
        const unsigned count = resume_at(r, done, rest);
        n = file_.preadv(fd, rest.data(), static_cast<int>(count), static_cast<off_t>(r.offset + done));
      } else {
        n = file_.pread(fd, r.buf + done, r.len - done, static_cast<off_t>(r.offset + done));
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
  /// Queues reads of the started jobs, oldest first, while the ring has room; submits them;
  /// with `wait`, waits for at least one completion. Then reaps every completion there is. If
  /// the ring breaks, waits for every read it took (the kernel writes into the callers'
  /// buffers), forgets every job, and throws.
  void push(bool wait) {
    while (!pending_.empty() && inflight_ < depth_) {
      Job& job = jobs_.at(pending_.front());
      io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
      if (!sqe) break;
      IoRead& r = job.reads[job.next];
      if (r.iov) {
        io_uring_prep_readv(sqe, job.fd, r.iov, r.iov_count, r.offset);
      } else if (const Region* reg = region_of(r.buf, r.len)) {
        io_uring_prep_read_fixed(sqe, job.fd, r.buf, static_cast<unsigned>(r.len), r.offset, static_cast<int>(reg->index));
        ++fixed_reads_;
      } else {
        io_uring_prep_read(sqe, job.fd, r.buf, static_cast<unsigned>(r.len), r.offset);
      }
      io_uring_sqe_set_data64(sqe, pending_.front() * kMaxReadsPerToken + job.next);
      ++job.next;
      ++job.outstanding;
      ++inflight_;
      if (job.next == job.reads.size()) pending_.pop_front();
    }
    // Submits everything queued (a busy or interrupted submit is retried) and maybe waits.
    const int rc = file_.uring_submit(ring_.get(), wait && inflight_ > 0 ? 1 : 0);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      std::size_t taken = inflight_ - io_uring_sq_ready(ring_.get());
      while (taken > 0) {
        io_uring_cqe* cqe = nullptr;
        const int w = io_uring_wait_cqe(ring_.get(), &cqe);
        if (w == -EINTR) continue;
        if (w < 0) break;
        io_uring_cqe_seen(ring_.get(), cqe);
        --taken;
      }
      broken_ = true;
      jobs_.clear();
      pending_.clear();
      inflight_ = 0;
      fail("io_uring submit failed: {}", std::strerror(-rc));
    }
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(ring_.get(), &cqe) == 0 && cqe) reap(cqe);
  }

  void reap(io_uring_cqe* cqe) {
    const std::uint64_t data = io_uring_cqe_get_data64(cqe);
    const std::int64_t res = cqe->res;
    io_uring_cqe_seen(ring_.get(), cqe);
    --inflight_;
    Job& job = jobs_.at(data / kMaxReadsPerToken);
    IoRead& r = job.reads[data % kMaxReadsPerToken];
    --job.outstanding;
    r.result = file_.uring_result(job.fd, r.offset, r.len, res);
    // A partial read (possible on some files) is finished synchronously.
    if (r.result > 0 && static_cast<std::size_t>(r.result) < r.len) {
      IoRead rest{r.offset + static_cast<std::uint64_t>(r.result), r.len - static_cast<std::size_t>(r.result), nullptr, 0};
      if (r.iov) {
        rest.iov = tail_.data();
        rest.iov_count = resume_at(r, static_cast<std::size_t>(r.result), tail_);
      } else {
        rest.buf = r.buf + r.result;
      }
      pread_full(job.fd, rest);
      r.result = rest.result < 0 ? rest.result : r.result + rest.result;
    }
  }

  /// Waits for every read in flight (before the ring or the callers' buffers go away).
  void drain() {
    // Entries queued but not yet submitted would never complete: submit them first.
    while (!broken_ && io_uring_sq_ready(ring_.get()) > 0) {
      const int rc = file_.uring_submit(ring_.get(), 0);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) break;
    }
    inflight_ -= std::min<std::size_t>(inflight_, io_uring_sq_ready(ring_.get()));  // left unsubmitted: never run
    while (inflight_ > 0 && !broken_) {
      io_uring_cqe* cqe = nullptr;
      const int w = io_uring_wait_cqe(ring_.get(), &cqe);
      if (w == -EINTR) continue;
      if (w < 0) break;
      const std::uint64_t data = io_uring_cqe_get_data64(cqe);
      io_uring_cqe_seen(ring_.get(), cqe);
      --inflight_;
      auto it = jobs_.find(data / kMaxReadsPerToken);
      if (it != jobs_.end()) --it->second.outstanding;
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
  std::deque<IoToken> pending_;  ///< jobs with reads not yet queued, oldest first
  std::size_t inflight_ = 0;     ///< reads queued or submitted, not yet reaped
  IovArray tail_;                ///< the rest of a partial vectored read
  std::unique_ptr<io_uring> ring_;
  std::vector<Region> regions_;  ///< sorted by base
  bool table_ready_ = false, table_failed_ = false;
#endif
  std::size_t registered_bytes_ = 0;
  std::uint64_t fixed_reads_ = 0;

  /// The reads of one start().
  struct Job {
    int fd = -1;
    std::span<IoRead> reads;
    std::size_t next = 0;         ///< reads queued to the ring so far
    std::size_t outstanding = 0;  ///< queued and not yet reaped
  };
  static constexpr std::uint64_t kMaxReadsPerToken = std::uint64_t{1} << 24;  // user_data = token x this + read

  [[no_unique_address]] File file_;
  IoBackend backend_ = IoBackend::threads;
  unsigned depth_ = 1;
  std::unique_ptr<ThreadPool> pool_;
  std::unordered_map<IoToken, Job> jobs_;
  IoToken tokens_ = 0;
  bool broken_ = false;
};

using IoEngine = BasicIoEngine<>;

}  // namespace kvdrive::tier
