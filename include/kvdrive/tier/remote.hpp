// Remote tiers: stores shared by engines on other machines (tier::RedisTier), addressed by
// content so that sequences with a common prompt prefix share its pages (Decision 10).
//
// A remote tier addresses shared pages by content: publish() stores pages best-effort,
// lookup() counts the leading pages present for every stream, and submit() + wait_each() read
// pages and report each read's outcome instead of throwing. Each takes the sequence's page
// chain (PageChain): chain[p] names page p of every layer and head, and a page's key is
// (model, chain[page], layer, head, page): the PageKey's sequence is not part of it. Chained
// keys digest a page's tokens and every token before it (manager/prefix_share.hpp), so two
// prompts meet on exactly their common leading whole pages, whatever follows them. A remote tier is never the only copy of a page (KvManager keeps
// every page on its own tiers) and never stops decoding: a down server, a timeout, a missing or
// a corrupt value is a miss. It is not a tier of Tiers<...> (see KvManager::share_prefixes).
//
// Values carry a header and a checksum bound to the key (RemoteValue), so a value that is
// damaged, truncated, from another layout, or stored under another key is never used.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "kvdrive/core/digest.hpp"
#include "kvdrive/core/xxhash.hpp"
#include "kvdrive/tier/concept.hpp"

namespace kvdrive::tier {

/// What became of one remote read.
enum class RemoteRead : std::uint8_t {
  hit,      ///< the page's bytes are in the caller's buffer, checksum verified
  missing,  ///< the server does not hold the key (never stored, expired, evicted)
  corrupt,  ///< a value was there but failed its checks (size, header, checksum): not used
  error,    ///< no answer: server down, timeout, connection lost, error reply
};

/// Counters of a remote tier, since it was made. Reads count pages.
struct RemoteStats {
  std::uint64_t hits = 0, missing = 0, corrupt = 0, errors = 0;  ///< reads, by outcome
  std::uint64_t written = 0;                                     ///< pages stored
  std::uint64_t write_errors = 0;                                ///< pages not stored: server down, timeout, error reply
  std::uint64_t over_budget = 0;                                 ///< pages not stored: the byte budget was full
  std::uint64_t dropped = 0;                                     ///< published pages dropped: too many bytes already queued
  std::uint64_t bytes_read = 0, bytes_written = 0;               ///< page bytes (hits, stored pages)
  std::uint64_t lookups = 0;                                     ///< lookup() calls
  std::uint64_t lookup_errors = 0;                               ///< lookups cut short by the server (counted as nothing more found)
  std::uint64_t connects = 0;                                    ///< connections made (the first, and each reconnect)
  std::uint64_t misses() const { return missing + corrupt + errors; }
};

/// The value format: a 16-byte header (magic, page bytes, checksum of key and page) then the
/// page. The checksum is xxh3-64 of the page seeded with xxh3-64 of the key.
struct RemoteValue {
  static constexpr std::uint32_t kMagic = 0x5244564B;  // "KVDR"
  static constexpr std::size_t kHeaderBytes = 16;

  static std::uint64_t checksum(std::string_view key, const std::byte* page, std::size_t n) {
    return XXH3_64bits_withSeed(page, n, XXH3_64bits(key.data(), key.size()));
  }
  /// Writes header + page into `out` (kHeaderBytes + n bytes).
  static void encode(std::string_view key, const std::byte* page, std::size_t n, std::byte* out) {
    const auto bytes = static_cast<std::uint32_t>(n);
    const std::uint64_t sum = checksum(key, page, n);
    std::memcpy(out, &kMagic, 4);
    std::memcpy(out + 4, &bytes, 4);
    std::memcpy(out + 8, &sum, 8);
    std::memcpy(out + kHeaderBytes, page, n);
  }
  /// Checks a value read for `key` and copies its page (n bytes) into dst; dst is untouched
  /// unless the value is whole and its checksum matches.
  static bool decode(std::string_view key, const std::byte* value, std::size_t value_bytes, std::byte* dst, std::size_t n) {
    if (value_bytes != kHeaderBytes + n) return false;
    std::uint32_t magic = 0, bytes = 0;
    std::uint64_t sum = 0;
    std::memcpy(&magic, value, 4);
    std::memcpy(&bytes, value + 4, 4);
    std::memcpy(&sum, value + 8, 8);
    if (magic != kMagic || bytes != n || sum != checksum(key, value + kHeaderBytes, n)) return false;
    std::memcpy(dst, value + kHeaderBytes, n);
    return true;
  }
};

/// The content keys of a sequence's shared pages: chain[p] names page p (of every layer and
/// head). A request's PageKey::page indexes it.
using PageChain = std::span<const PrefixDigest>;

template <class T>
concept RemoteTier = requires(T& t, const T& ct, const TierGeometry& g, PageChain chain, std::span<const WriteRequest> pages,
                              std::span<const ReadRequest> reads, ReadTicket ticket, std::span<RemoteRead> outcomes, std::uint32_t n) {
  t.open(g);                                                 // the page size; a tier may be opened again with the same one
  t.publish(chain, pages);                                   // store best-effort; never throws
  { t.lookup(chain, n, n) } -> std::same_as<std::uint32_t>;  // leading pages of chain present for every (layer, head)
  { t.submit(chain, reads) } -> std::same_as<ReadTicket>;
  t.wait_each(ticket, outcomes);  // each read's outcome; never throws for server trouble
  { ct.remote_stats() } -> std::same_as<RemoteStats>;
};

/// The default of KvManager's Remote parameter: no remote tier.
struct NoRemote {};

}  // namespace kvdrive::tier
