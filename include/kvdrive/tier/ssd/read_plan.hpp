// SsdTier's reads: how a batch of page reads becomes I/Os (adjacent data blocks merged into one
// read of up to max_merge_bytes, pages packed in one block read once; straight into the callers'
// buffers, a readv per run, when direct I/O allows it, else into the batch's own bounce buffer),
// and how a finished batch is checked:
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

/// Lays out the batch's I/Os, its wants given: runs of adjacent data blocks become one read of
/// up to max_merge_bytes (pages packed in one block share its read). Pages go straight into the
/// callers' buffers (one readv per run, at most max_iov pages) when slots are unpacked, carry no
/// padding and every buffer is aligned (under direct I/O); otherwise runs are read into the
/// batch's bounce buffer, to be copied out when checked.
inline void plan_ops(ReadBatch& b, const Layout& l, bool direct, std::size_t max_merge_bytes, std::size_t max_iov) {
  std::sort(b.want.begin(), b.want.end(), [](const Want& x, const Want& y) { return x.slot < y.slot; });
  b.scatter = !l.packed() && l.slot_bytes == l.page_bytes;
  for (std::size_t i = 0; b.scatter && i < b.want.size(); ++i)
    b.scatter = !direct || reinterpret_cast<std::uintptr_t>(b.want[i].req->dst) % l.align == 0;
  const std::size_t bb = l.block_bytes();
  std::size_t total = 0;
  for (std::size_t i = 0; i < b.want.size();) {
    const std::uint64_t first = l.block_of(b.want[i].slot);
    std::uint64_t last = first;
    std::size_t j = i + 1;
    for (; j < b.want.size(); ++j) {
      const std::uint64_t next = l.block_of(b.want[j].slot);
      if (next == last && !b.scatter) continue;  // the same block: already read (a scattered read has one buffer per block)
      if (next != last + 1 || (next - first + 1) * bb > max_merge_bytes || (b.scatter && j - i >= max_iov)) break;
      last = next;
    }
    const std::size_t len = static_cast<std::size_t>(last - first + 1) * bb;
    b.ops.push_back({l.block_offset(first), len, nullptr, 0});
    b.first.push_back(i);
    total += len;
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

/// Bytes the batch reads from the device (its merged block runs).
inline std::uint64_t device_bytes(const ReadBatch& b) {
  std::uint64_t n = 0;
  for (const IoRead& op : b.ops) n += op.len;
  return n;
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
    KVD_EXPECT(static_cast<std::size_t>(op.result) == op.len, "SsdTier {}: short read of page {} (slot {}): {} of {} bytes", path, w0.req->key,
               w0.slot, op.result, op.len);
    const std::size_t end = o + 1 < b.ops.size() ? b.first[o + 1] : b.want.size();
    const std::uint64_t first_block = l.block_of(w0.slot);
    for (std::size_t k = b.first[o]; k < end; ++k) {
      const Want& w = b.want[k];
      const std::byte* src = b.scatter ? w.req->dst : op.buf + (l.block_of(w.slot) - first_block) * l.block_bytes() + l.offset_in_block(w.slot);
      std::uint64_t h = 0;
      KVD_EXPECT(Verify::intact(src, l.page_bytes, w.hash, h),
                 "SsdTier {}: checksum mismatch on page {} (slot {}): stored xxh3 {:016x}, read {:016x}", path, w.req->key, w.slot, w.hash, h);
      if (!b.scatter) std::memcpy(w.req->dst, src, l.page_bytes);
    }
  }
}

}  // namespace kvdrive::tier::ssd
