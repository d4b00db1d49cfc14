// PrefixDigest: a 128-bit content digest (xxh3-128) of a prompt prefix's token ids. Given to
// add_sequence (Decision 10) so that content-addressed tiers can share the pages of a common
// prefix across sequences and engines.
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

  static PrefixDigest of_bytes(const void* data, std::size_t size) {
    const XXH128_hash_t h = XXH3_128bits(data, size);
    return {h.low64, h.high64};
  }
  static PrefixDigest of_tokens(std::span<const std::int32_t> tokens) {
    return of_bytes(tokens.data(), tokens.size_bytes());
  }

  std::string hex() const { return fmt::format("{:016x}{:016x}", high, low); }
  friend bool operator==(const PrefixDigest&, const PrefixDigest&) = default;
};

}  // namespace kvdrive
