// BasicSsdTier's write path (tier/ssd.hpp declares these members and includes this header at its
// end). A write batch takes a slot for every page (all or nothing), writes the pages' fresh blocks,
// syncs the data, appends its log records (the pending erases first) and syncs the log; only then
// are its pages visible, and the slots they replaced, or that erases freed, free to reuse. If a
// step fails, the log is cut back to its last committed block and the slots are given back:
// nothing changes (commit or nothing). erase() queues a record that the next write or sync()
// makes durable.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/ssd.hpp"
#include "kvdrive/tier/ssd/layout.hpp"
#include "kvdrive/tier/ssd/log.hpp"
#include "kvdrive/tier/ssd_format.hpp"

namespace kvdrive::tier {

template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::write_batch(std::span<const WriteRequest> pages) {
  std::lock_guard lock(mutex_);
  check_writable();
  if (pages.empty()) return;
  check_distinct(pages);
  // Erased pages' slots become usable once their records are durable: flush them first when
  // the store needs the room.
  if (!pending_erases_.empty() && params_.capacity_pages && pages.size() > room(false)) flush_erases();
  // Slots first (all or nothing), then data, sync, log, sync.
  const std::vector<std::uint64_t> slots = take_slots(pages);
  std::vector<std::uint64_t> hashes(pages.size());
  for (std::size_t i = 0; i < pages.size(); ++i) hashes[i] = ssd_format::page_hash(pages[i].src, layout_.page_bytes);
  try {
    write_data(pages, slots);
    files_.datasync(files_.data(), params_.path);
    // The log: pending erases first, then the puts.
    std::vector<ssd_format::LogRecord> records = pending_erases_;
    for (std::size_t i = 0; i < pages.size(); ++i)
      records.push_back(ssd::make_record(ssd_format::RecordKind::put, pages[i].key, slots[i], hashes[i]));
    append_log(records);
  } catch (...) {
    roll_back_log();
    slots_.free(slots);
    throw;
  }
  make_visible(pages, slots, hashes);
}

template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::erase(const PageKey& key) {
  std::lock_guard lock(mutex_);
  check_writable();
  auto it = map_.find(key);
  if (it == map_.end()) return;
  pending_erases_.push_back(ssd::make_record(ssd_format::RecordKind::erase, key, it->second.slot, 0));
  pending_erases_.back().sequence = 0;  // numbered when written
  slots_.defer(it->second.slot);
  map_.erase(it);
}

template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::sync() {
  std::lock_guard lock(mutex_);
  check_writable();
  flush_erases();
}

template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::check_distinct(std::span<const WriteRequest> pages) const {
  std::vector<PageKey> keys;
  keys.reserve(pages.size());
  for (const WriteRequest& r : pages) keys.push_back(r.key);
  const auto less = [](const PageKey& a, const PageKey& b) {
    return std::tie(a.sequence, a.layer, a.head, a.page) < std::tie(b.sequence, b.layer, b.head, b.page);
  };
  std::sort(keys.begin(), keys.end(), less);
  const auto twice = std::adjacent_find(keys.begin(), keys.end());
  KVD_EXPECT(twice == keys.end(), "SsdTier {}: page {} twice in one write batch", params_.path, *twice);
}

/// Pages that fit (packed: in whole free blocks), counting the slots of erases not yet durable
/// as free or not. Only with a capacity.
template <SsdFile File, class Verify>
std::size_t BasicSsdTier<File, Verify>::room(bool with_deferred) const {
  const std::size_t held = map_.size() + (with_deferred ? 0 : pending_erases_.size());
  const std::size_t left = params_.capacity_pages - std::min(params_.capacity_pages, held);
  return layout_.packed() ? std::min(left, slots_.free_pages(with_deferred)) : left;
}

/// A slot for every page, in the batch's order (packed: filling fresh blocks), or none (the
/// store is full: throws naming the first page that does not fit).
template <SsdFile File, class Verify>
std::vector<std::uint64_t> BasicSsdTier<File, Verify>::take_slots(std::span<const WriteRequest> pages) {
  std::vector<PageKey> keys;
  keys.reserve(pages.size());
  for (const WriteRequest& r : pages) keys.push_back(r.key);
  std::optional<std::vector<std::uint64_t>> slots = slots_.take(keys);
  if (!slots) {
    const std::size_t fits = std::min(room(false), pages.size() - 1);
    fail("SsdTier {}: full ({} pages); page {} does not fit", params_.path, params_.capacity_pages, pages[fits].key);
  }
  return std::move(*slots);
}

/// Writes the pages into their slots, each run of adjacent blocks as one write of whole
/// blocks (the blocks are fresh: slots a batch leaves unused are zeros).
template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::write_data(std::span<const WriteRequest> pages, const std::vector<std::uint64_t>& slots) {
  std::vector<std::size_t> order(pages.size());
  for (std::size_t i = 0; i < pages.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return slots[a] < slots[b]; });
  const ssd::Layout& l = layout_;
  const std::size_t bb = l.block_bytes();
  for (std::size_t i = 0; i < order.size();) {
    const std::uint64_t first = l.block_of(slots[order[i]]);
    std::uint64_t last = first;
    std::size_t j = i + 1;
    for (; j < order.size(); ++j) {
      const std::uint64_t next = l.block_of(slots[order[j]]);
      if (next != last && (next != last + 1 || (next - first + 1) * bb > params_.max_merge_bytes)) break;
      last = next;
    }
    const std::size_t len = static_cast<std::size_t>(last - first + 1) * bb;
    std::byte* buf = bounce_.get(len, l.align);
    std::memset(buf, 0, len);
    for (std::size_t k = i; k < j; ++k) {
      const std::uint64_t s = slots[order[k]];
      std::memcpy(buf + (l.block_of(s) - first) * bb + l.offset_in_block(s), pages[order[k]].src, l.page_bytes);
    }
    files_.write_all(files_.data(), buf, len, l.block_offset(first), params_.path, pages[order[i]].key);
    i = j;
  }
}

/// The batch is durable: its pages become visible, and the slots it replaced or that erases
/// freed are durable garbage now, to be reused.
template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::make_visible(std::span<const WriteRequest> pages, const std::vector<std::uint64_t>& slots,
                                              const std::vector<std::uint64_t>& hashes) {
  next_sequence_ += pending_erases_.size() + pages.size();
  pending_erases_.clear();
  slots_.free_deferred();
  std::vector<std::uint64_t> replaced;
  for (std::size_t i = 0; i < pages.size(); ++i) {
    auto [it, fresh] = map_.try_emplace(pages[i].key, Entry{slots[i], hashes[i]});
    if (!fresh) {
      replaced.push_back(it->second.slot);
      it->second = Entry{slots[i], hashes[i]};
    }
  }
  slots_.free(replaced);
}

/// Numbers the records from next_sequence_, writes them in fresh blocks and syncs. Does not
/// advance next_sequence_ (the caller does once the batch is visible).
template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::append_log(std::vector<ssd_format::LogRecord>& records) {
  const std::size_t len = ssd::encode_records(records, next_sequence_, layout_, bounce_);
  files_.write_all(files_.log(), bounce_.data(), len, log_end_, log_name(), records.front().key());
  files_.datasync(files_.log(), log_name());
  log_end_ += len;
}

/// After a failed append: cut the log back to its last committed block, so that a record
/// that may have landed cannot point at slots handed out again. If even that fails, the
/// store refuses further calls (reopen it).
template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::roll_back_log() noexcept {
  if (dead_) return;
  try {
    dead_ = !files_.cut(files_.log(), log_end_);
  } catch (...) {  // a File that throws (a test's simulated power loss)
    dead_ = true;
  }
}

template <SsdFile File, class Verify>
void BasicSsdTier<File, Verify>::flush_erases() {
  if (pending_erases_.empty()) return;
  try {
    append_log(pending_erases_);
  } catch (...) {
    roll_back_log();
    throw;
  }
  next_sequence_ += pending_erases_.size();
  pending_erases_.clear();
  slots_.free_deferred();
}

}  // namespace kvdrive::tier
