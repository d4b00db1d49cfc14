// PrefixDigest: a 128-bit content digest (xxh3-128) of a prompt prefix's token ids, with the
// number of tokens it covers. Given to add_sequence (Decision 10) so that content-addressed
// tiers (tier::RedisTier) can share the pages of a common prefix across sequences and engines:
// the pages wholly inside the first `tokens` tokens are the same wherever that prefix is run.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include <fmt/format.h>

#include "kvdrive/core/xxhash.hpp"

namespace kvdrive {

struct PrefixDigest {
  std::uint64_t low = 0;
  std::uint64_t high = 0;
  std::int64_t tokens = 0;  ///< prompt tokens the digest covers (0: unknown, nothing is shared)

  /// The digest of any bytes (a model's weights, say), covering `tokens` tokens.
  static PrefixDigest of_bytes(const void* data, std::size_t size, std::int64_t tokens = 0) {
    const XXH128_hash_t h = XXH3_128bits(data, size);
    return {h.low64, h.high64, tokens};
  }
  /// The digest of a prompt prefix: its token ids.
  static PrefixDigest of_tokens(std::span<const std::int32_t> tokens) {
    return of_bytes(tokens.data(), tokens.size_bytes(), static_cast<std::int64_t>(tokens.size()));
  }

  /// 32 hex digits of the digest (the token count is not part of it).
  std::string hex() const { return fmt::format("{:016x}{:016x}", high, low); }
  friend bool operator==(const PrefixDigest&, const PrefixDigest&) = default;
};

}  // namespace kvdrive
