// BasicSsdTier's opening of a store (tier/ssd.hpp declares these members and includes this header
// at its end). open() takes the store's lock (PATH.lock), deletes the store first for
// SsdOpen::recreate, checks that existing files are a kvdrive store's, then either makes a new
// store (both headers, then the directory entries) or recovers an existing one: its headers
// checked against each other and the device, its log replayed up to the first bad block
// (ssd/log.hpp) and cut there, its free slots rebuilt. A store whose making was cut short (an
// empty log) is made again. If any step fails, nothing stays open, the lock included.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/ssd.hpp"
#include "kvdrive/tier/ssd/layout.hpp"
#include "kvdrive/tier/ssd/log.hpp"
#include "kvdrive/tier/ssd_format.hpp"

namespace kvdrive::tier {

template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::open(const TierGeometry& g) {
  std::lock_guard lock(mutex_);
  KVD_EXPECT(!files_.is_open(), "SsdTier {}: already open", params_.path);
  KVD_EXPECT(!params_.path.empty(), "SsdTier: no path given");
  KVD_EXPECT(g.page_bytes > 0, "SsdTier: page size 0");
  KVD_EXPECT(params_.extent_pages >= 1 && params_.max_merge_bytes >= 1, "SsdTier {}: extent_pages and max_merge_bytes must be >= 1", params_.path);
  layout_.page_bytes = g.page_bytes;
  try {
    files_.lock(params_.path, read_only());
    if (params_.mode == SsdOpen::recreate) files_.remove_store(params_.path);
    const bool exists = files_.exists(params_.path);
    KVD_EXPECT(!exists || files_.is_store_or_empty(params_.path), "{} is not a kvdrive store (bad header)",
               params_.path);  // before the log is made beside it
    KVD_EXPECT(!read_only() || (exists && files_.exists(log_name())), "SsdTier {}: no store there to open read-only", params_.path);
    files_.open(params_.path, exists, exists && files_.exists(log_name()), params_.direct_io, read_only());
    layout_.align = params_.alignment ? params_.alignment : files_.dio_alignment();
    KVD_EXPECT(layout_.align >= 512 && (layout_.align & (layout_.align - 1)) == 0, "SsdTier {}: alignment {} is not a power of two >= 512",
               params_.path, layout_.align);
    if (exists && !creation_cut_short()) recover();
    else create();
    slots_.configure(params_.capacity_pages, params_.extent_pages, layout_.per_block);
    slots_.rebuild(map_);
    io_.open(params_.io, params_.queue_depth, 0);
  } catch (...) {  // nothing half-open stays behind, the lock included
    files_.close();
    map_.clear();
    throw;
  }
}

/// A store whose making was cut short (killed between making the files and syncing the log's
/// header): the log is empty, so no page was ever committed (open() has checked that the data
/// file is empty or has a kvdrive header). create() finishes it. Anything else is for recover()
/// to accept or refuse.
template <SsdFile File, class Verify>
bool BasicSsdTier<File, Verify>::creation_cut_short() {
  if (files_.size(files_.log(), log_name()) != 0) return false;
  KVD_EXPECT(!read_only(), "SsdTier {}: a store whose making was cut short (an empty log); open it for writing once to finish it", params_.path);
  recovery_.why = "a store whose making was cut short (an empty log): made again";
  return true;
}

/// A new store: both headers, then the directory entries. Its blocks are at least 4 KiB,
/// flash's unit of reads, even where direct I/O allows less (Params::alignment sets them).
template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::create() {
  if (params_.alignment == 0) layout_.align = std::max(layout_.align, ssd::Layout::kMinBlockBytes);
  layout_.set_slot_bytes(ssd::Layout::slot_size(layout_.page_bytes, layout_.align, params_.pack_pages));
  files_.write_header(files_.data(), ssd_format::kDataMagic, layout_, params_.path);
  files_.write_header(files_.log(), ssd_format::kLogMagic, layout_, log_name());
  log_end_ = layout_.align;
  files_.sync_directory(params_.path);
}

/// An existing store: its headers, the log replayed (then cut at its end, so that blocks past
/// a torn one can never be replayed later), and the free slots.
template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::recover() {
  read_headers();
  const ssd::LogEnd end = ssd::replay_log(files_, layout_, params_.path, [&](const ssd_format::LogRecord& rec) { apply(rec); });
  recovery_ = end;
  log_end_ = end.offset;
  next_sequence_ = end.next_sequence;
  if (!read_only())  // a read-only open leaves the log as it is
    KVD_EXPECT(files_.cut(files_.log(), log_end_), "{}.log: cannot cut the log after recovery: {}", params_.path, std::strerror(errno));
}

template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::read_headers() {
  const ssd_format::Header dh = files_.read_header(files_.data(), ssd_format::kDataMagic, layout_.align, layout_.page_bytes, params_.path);
  // The store's own alignment lays out its slots; the device's must divide it.
  KVD_EXPECT(dh.alignment >= 512 && (dh.alignment & (dh.alignment - 1)) == 0 && dh.alignment % layout_.align == 0,
             "{}: made with {}-byte alignment, but this device needs {}", params_.path, dh.alignment, layout_.align);
  layout_.align = dh.alignment;
  const ssd_format::Header lh = files_.read_header(files_.log(), ssd_format::kLogMagic, layout_.align, layout_.page_bytes, log_name());
  KVD_EXPECT(lh.slot_bytes == dh.slot_bytes && lh.alignment == dh.alignment, "{}: data and log headers disagree", params_.path);
  KVD_EXPECT(layout_.valid_slot_bytes(dh.slot_bytes) && (dh.version >= 2 || dh.slot_bytes % dh.alignment == 0), "{}: bad slot size {}", params_.path,
             dh.slot_bytes);
  layout_.set_slot_bytes(dh.slot_bytes);
}

template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::apply(const ssd_format::LogRecord& rec) {
  if (rec.kind == ssd_format::RecordKind::put) map_[rec.key()] = Entry{rec.slot, rec.data_hash};
  else map_.erase(rec.key());
}

}  // namespace kvdrive::tier
