// SsdTier's reads: how a batch of page reads becomes I/Os (adjacent slots merged into one read
// of up to max_merge_bytes; straight into the callers' buffers, a readv per run, when direct
// I/O allows it, else into the batch's own bounce buffer), and how a finished batch is checked:
// each I/O's result, then each page against the xxh3 its log record holds (VerifyPages, the
// tier's default page check), so a flipped bit is an error naming the page, never wrong data.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <sys/uio.h>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/io_engine.hpp"
#include "kvdrive/tier/ssd/layout.hpp"
#include "kvdrive/tier/ssd_format.hpp"

namespace kvdrive::tier {

/// BasicSsdTier's default page check: a page read back must hash to the xxh3 stored with it.
struct VerifyPages {
  /// Whether the page read back is the one stored; `read` receives its hash.
  static bool intact(const std::byte* page, std::size_t bytes, std::uint64_t stored, std::uint64_t& read) {
    read = ssd_format::page_hash(page, bytes);
    return read == stored;
  }
};

}  // namespace kvdrive::tier

namespace kvdrive::tier::ssd {

/// One page to read: its slot, its stored hash and its request.
struct Want {
  std::uint64_t slot, hash;
  const ReadRequest* req;
};

/// A submitted batch: its requests, the I/Os that read them, and their buffers.
struct ReadBatch {
  std::vector<ReadRequest> reads;
  std::vector<Want> want;          ///< by slot
  std::vector<IoRead> ops;         ///< runs of adjacent slots
  std::vector<std::size_t> first;  ///< first want of each op
  std::vector<::iovec> iov;        ///< scattered: one buffer per page
  AlignedBuffer bounce;
  bool scatter = false;
  IoToken token = 0;
};

/// Lays out the batch's I/Os, its wants given: pages go straight into the callers' buffers (one
/// readv per run of adjacent slots, at most max_iov pages) when every buffer is aligned (under
/// direct I/O) and slots carry no padding; otherwise runs are read into the batch's bounce
/// buffer, to be copied out when checked.
inline void plan_ops(ReadBatch& b, const Layout& l, bool direct, std::size_t max_merge_bytes, std::size_t max_iov) {
  std::sort(b.want.begin(), b.want.end(), [](const Want& x, const Want& y) { return x.slot < y.slot; });
  b.scatter = l.slot_bytes == l.page_bytes;
  for (std::size_t i = 0; b.scatter && i < b.want.size(); ++i)
    b.scatter = !direct || reinterpret_cast<std::uintptr_t>(b.want[i].req->dst) % l.align == 0;
  std::size_t total = 0;
  const std::size_t max_run = b.scatter ? max_iov : std::numeric_limits<std::size_t>::max();
  for (std::size_t i = 0; i < b.want.size();) {
    std::size_t j = i + 1;
    while (j < b.want.size() && b.want[j].slot == b.want[j - 1].slot + 1 && (j - i + 1) * l.slot_bytes <= max_merge_bytes && j - i < max_run)
      ++j;
    b.ops.push_back({l.slot_offset(b.want[i].slot), (j - i) * l.slot_bytes, nullptr, 0});
    b.first.push_back(i);
    total += (j - i) * l.slot_bytes;
    i = j;
  }
  if (b.scatter) {
    b.iov.reserve(b.want.size());
    for (const Want& w : b.want) b.iov.push_back({w.req->dst, l.page_bytes});
    for (std::size_t o = 0; o < b.ops.size(); ++o) {
      if (b.ops[o].len == l.slot_bytes) {  // one page: a plain read, fixed where the buffer is registered
        b.ops[o].buf = b.want[b.first[o]].req->dst;
        continue;
      }
      b.ops[o].iov = b.iov.data() + b.first[o];
      b.ops[o].iov_count = static_cast<unsigned>(b.ops[o].len / l.slot_bytes);
    }
  } else {
    std::byte* at = b.bounce.get(total, l.align);
    for (IoRead& op : b.ops) {
      op.buf = at;
      at += op.len;
    }
  }
}

/// Checks a finished batch: throws naming the page on an I/O error, a short read or a page that
/// fails Verify; copies bounced pages out to the callers.
template <class Verify>
void check_reads(const ReadBatch& b, const Layout& l, const std::string& path) {
  for (std::size_t o = 0; o < b.ops.size(); ++o) {
    const IoRead& op = b.ops[o];
    const Want& w0 = b.want[b.first[o]];
    KVD_EXPECT(op.result >= 0, "SsdTier {}: read error on page {} (slot {}): {}", path, w0.req->key, w0.slot,
               std::strerror(static_cast<int>(-op.result)));
    KVD_EXPECT(static_cast<std::size_t>(op.result) == op.len, "SsdTier {}: short read of page {} (slot {}): {} of {} bytes", path,
               w0.req->key, w0.slot, op.result, op.len);
    const std::size_t pages_in_op = op.len / l.slot_bytes;
    for (std::size_t k = 0; k < pages_in_op; ++k) {
      const Want& w = b.want[b.first[o] + k];
      const std::byte* src = b.scatter ? w.req->dst : op.buf + k * l.slot_bytes;
      std::uint64_t h = 0;
      KVD_EXPECT(Verify::intact(src, l.page_bytes, w.hash, h),
                 "SsdTier {}: checksum mismatch on page {} (slot {}): stored xxh3 {:016x}, read {:016x}", path, w.req->key, w.slot,
                 w.hash, h);
      if (!b.scatter) std::memcpy(w.req->dst, src, l.page_bytes);
    }
  }
}

}  // namespace kvdrive::tier::ssd
