// tier::RemoteChoice<Ts...>: one of several remote tiers, chosen at run time (kvd-llama takes
// --prefix-store DIR for a local PrefixStore, or --remote URL for a RedisTier). It is itself a
// RemoteTier that forwards every call to the tier it holds; it must hold one before
// KvManager::share_prefixes() is given it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "kvdrive/core/error.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/remote.hpp"

namespace kvdrive::tier {

template <RemoteTier... Ts>
class RemoteChoice {
 public:
  /// Makes the tier T (one of Ts) in place, replacing any held before.
  template <class T, class... Args>
  T& emplace(Args&&... args) {
    return v_.template emplace<T>(std::forward<Args>(args)...);
  }
  bool holds_one() const { return v_.index() != 0; }
  template <class T>
  T* get() {
    return std::get_if<T>(&v_);
  }

  void open(const TierGeometry& g) {
    visit([&](auto& t) { t.open(g); });
  }
  void publish(PageChain chain, std::span<const WriteRequest> pages) noexcept {
    if (holds_one()) visit([&](auto& t) { t.publish(chain, pages); });
  }
  std::uint32_t lookup(PageChain chain, std::uint32_t layers, std::uint32_t heads) {
    return visit([&](auto& t) { return t.lookup(chain, layers, heads); });
  }
  ReadTicket submit(PageChain chain, std::span<const ReadRequest> reads) {
    return visit([&](auto& t) { return t.submit(chain, reads); });
  }
  void wait_each(ReadTicket ticket, std::span<RemoteRead> outcomes) {
    visit([&](auto& t) { t.wait_each(ticket, outcomes); });
  }
  RemoteStats remote_stats() const {
    if (!holds_one()) return {};
    return std::visit(
        [](const auto& t) -> RemoteStats {
          if constexpr (std::is_same_v<std::decay_t<decltype(t)>, std::monostate>) return {};
          else return t.remote_stats();
        },
        v_);
  }
  /// Where the pages go: the tier's describe(), or its URL's.
  std::string describe() const {
    return std::visit(
        [](const auto& t) -> std::string {
          if constexpr (std::is_same_v<std::decay_t<decltype(t)>, std::monostate>) return "none";
          else if constexpr (requires { t.describe(); }) return t.describe();
          else return t.url().describe();
        },
        v_);
  }

 private:
  template <class F>
  decltype(auto) visit(F&& f) {
    KVD_EXPECT(holds_one(), "RemoteChoice: no remote tier chosen");
    return std::visit(
        [&](auto& t) -> decltype(f(std::get<1>(v_))) {
          if constexpr (std::is_same_v<std::decay_t<decltype(t)>, std::monostate>) throw Error("RemoteChoice: no remote tier chosen");
          else return f(t);
        },
        v_);
  }

  std::variant<std::monostate, Ts...> v_;
};

}  // namespace kvdrive::tier
