// SsdTier's parameters (SsdParams, one type for every BasicSsdTier) and the ways open() may treat
// the files at its path (SsdOpen): made, reopened, made again, or only inspected.
#pragma once

#include <cstddef>
#include <string>

#include "kvdrive/tier/io_engine.hpp"

namespace kvdrive::tier {

/// How SsdTier::open treats the files at its path. Every mode takes the store's lock first
/// (PATH.lock): one writer per store, in this process or any other.
enum class SsdOpen {
  open_or_create,  ///< reopen the store there (recovering its pages), or make one
  recreate,        ///< delete the store there (only if its files are a kvdrive store's, or empty), then make one
  read_only,       ///< inspect an existing store: its pages read back; writes, erases and syncs are refused
};

/// SsdTier::Params (one type for every BasicSsdTier).
struct SsdParams {
  std::string path;  ///< the data file (made if missing); the log is PATH.log, the lock PATH.lock
  SsdOpen mode = SsdOpen::open_or_create;
  bool delete_on_close = false;    ///< a scratch store: its data file and log go when the tier does
  std::size_t capacity_pages = 0;  ///< 0: grows until the disk is full
  std::size_t alignment = 0;       ///< blocks of a new store; 0: 4096, or the device's direct-I/O alignment (statx STATX_DIOALIGN) if larger
  unsigned queue_depth = 64;       ///< reads in flight
  std::size_t max_merge_bytes = 256u << 10;  ///< the largest merged read of adjacent slots
  std::size_t extent_pages = 64;             ///< slots a stream takes at a time (pages not packed)
  bool pack_pages = true;                    ///< a new store packs pages of up to half a block several to a block
  IoBackend io = IoBackend::automatic;
  bool direct_io = true;  ///< O_DIRECT where the file system allows it
};

}  // namespace kvdrive::tier
