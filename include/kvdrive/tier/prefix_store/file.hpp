// The files of a PrefixStore (tier/prefix_store.hpp): a .kvp file's 64-byte header and its pages'
// checksums, and the POSIX calls the store makes them with: an owned descriptor, whole writes
// and reads, and setting a file's mtime (its last use) to the nanosecond.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <utility>

#include "kvdrive/core/digest.hpp"
#include "kvdrive/core/xxhash.hpp"

namespace kvdrive::tier::prefix_store {

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

}  // namespace kvdrive::tier::prefix_store
