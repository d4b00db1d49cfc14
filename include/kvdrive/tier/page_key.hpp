// PageKey: the address of a page in every tier: (sequence, layer, KV head, page index).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include <fmt/format.h>

namespace kvdrive::tier {

struct PageKey {
  std::uint64_t sequence = 0;
  std::uint32_t layer = 0;
  std::uint32_t head = 0;
  std::uint32_t page = 0;
  friend bool operator==(const PageKey&, const PageKey&) = default;
};

struct PageKeyHash {
  std::size_t operator()(const PageKey& k) const noexcept {
    std::uint64_t h = k.sequence * 0x9E3779B97F4A7C15ull;
    h ^= (static_cast<std::uint64_t>(k.layer) << 40) ^ (static_cast<std::uint64_t>(k.head) << 20) ^ k.page;
    h *= 0xBF58476D1CE4E5B9ull;
    return static_cast<std::size_t>(h ^ (h >> 31));
  }
};

}  // namespace kvdrive::tier

template <>
struct fmt::formatter<kvdrive::tier::PageKey> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(const kvdrive::tier::PageKey& k, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "(seq {}, layer {}, head {}, page {})", k.sequence, k.layer, k.head, k.page);
  }
};
