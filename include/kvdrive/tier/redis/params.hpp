// tier::RedisParams, RedisTier::Params: where the server is, what the keys are made of, how long
// pages live and how many bytes this tier may keep there, and its timeouts and pipeline depth.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kvdrive/core/digest.hpp"

namespace kvdrive::tier {

struct RedisParams {
  std::string url = "redis://127.0.0.1:6379/0";  ///< see RedisUrl
  PrefixDigest model{};                          ///< the model/run digest: what else decides the K/V (weights, RoPE, ...)
  std::string key_prefix = "kvd";                ///< first part of every key
  /// The deployment's shared secret (at least 16 bytes), when clients the engines do not trust
  /// can write to the server: values then carry an HMAC-SHA-256 of key and page under it, and
  /// keys sit in a namespace derived from it. Empty: an unkeyed checksum, which catches damage,
  /// not forgery (the server and every client that writes to it must be trusted).
  std::string secret{};
  std::int64_t ttl_ms = 0;                                ///< stored pages expire after this long; 0: never
  std::uint64_t byte_budget = 0;                          ///< value bytes this tier keeps stored at most; 0: unbounded
  int timeout_ms = 1000;                                  ///< connecting, and waiting for each reply
  int retry_after_ms = 1000;                              ///< after a failed connection attempt, fail fast this long
  std::size_t max_in_flight = 64;                         ///< commands sent before their replies are read (1..65536)
  std::size_t max_queued_bytes = std::size_t{256} << 20;  ///< publish() drops pages past this backlog
};

}  // namespace kvdrive::tier
