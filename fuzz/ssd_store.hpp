// The store fuzz_ssd_recover damages: 48 pages of known bytes and one erase, written by SsdTier
// itself (in memory for the target, fuzz/mem_file.hpp; on disk for kvd-fuzz-seeds, which writes
// its log as the target's seed: the same bytes).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "harness.hpp"
#include "kvdrive/tier/ssd.hpp"

namespace kvdrive::fuzz {

using tier::PageKey;
using tier::SsdTier;

inline constexpr std::size_t kStorePage = 4096, kStorePages = 48, kErasedPage = 5;

inline std::vector<std::byte> page_bytes(const PageKey& k) {
  std::vector<std::byte> p(kStorePage);
  for (std::size_t i = 0; i < kStorePage; ++i) p[i] = static_cast<std::byte>((k.layer * 31 + k.head * 7 + k.page * 13 + i) & 0xff);
  return p;
}

inline PageKey key_of(std::size_t i) { return PageKey{1, static_cast<std::uint32_t>(i % 3), 0, static_cast<std::uint32_t>(i / 3)}; }

inline SsdTier::Params store_params(const std::string& path) {
  SsdTier::Params p;
  p.path = path;
  p.alignment = 4096;
  p.direct_io = false;  // tmpfs may refuse O_DIRECT; the format is the same
  p.io = tier::IoBackend::threads;
  p.queue_depth = 2;  // two reader threads: a pool of 16 made and joined per input was most of the target's time
  return p;
}

/// Writes the store at `path` (and PATH.log), through `file` (real files, or fuzz::MemFile).
template <class File = tier::PosixFile>
void write_store(const std::string& path, File file = File()) {
  tier::BasicSsdTier<File>::remove_files(path, file);
  tier::BasicSsdTier<File> t(store_params(path), file);
  t.open({kStorePage});
  for (std::size_t i = 0; i < kStorePages; ++i) {
    const auto bytes = page_bytes(key_of(i));
    t.write(key_of(i), bytes.data());
  }
  t.erase(key_of(kErasedPage));  // an erase record in the log too
}

}  // namespace kvdrive::fuzz
