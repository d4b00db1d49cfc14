// PrefixStore's folder (tier/prefix_store.hpp declares these members and includes this header at
// its end): the lock that lets one process at a time use it (an exclusive flock on DIR/lock, the
// holder's pid written in it so that the error names it), the listing of its .kvp files on open
// (their sizes and last uses; a crashed writer's temporaries deleted), and the folder's sync that
// makes renames durable.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/prefix_store.hpp"
#include "kvdrive/tier/prefix_store/file.hpp"

namespace kvdrive::tier {

inline void PrefixStore::lock() {
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
         : pid > 0         ? fmt::format("process {}", pid)
                           : std::string("another process"),
         name);
  }
  const std::string pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(lock_.fd, 0) == 0) (void)prefix_store::pwrite_all(lock_.fd, pid.data(), pid.size(), 0);
}

/// Lists the folder's .kvp files (their sizes and last uses) and deletes the temporaries a
/// crashed writer left (this process holds the lock, so no one is writing them).
inline void PrefixStore::scan() {
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

inline void PrefixStore::sync_dir() {
  prefix_store::Fd d(::open(p_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd >= 0) (void)::fsync(d.fd);
}

}  // namespace kvdrive::tier
