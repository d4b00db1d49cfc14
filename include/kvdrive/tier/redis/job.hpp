// RedisTier's unit of work: one Job per call (a read batch, a write, a publish, a one-key erase
// or exists, a prefix lookup, a barrier). A caller fills one in and queues it; the I/O thread
// runs it, fills in what it found (outcomes, stored, found, why) and marks it done.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvdrive/core/digest.hpp"
#include "kvdrive/tier/remote.hpp"

namespace kvdrive::tier::redis {

using Clock = std::chrono::steady_clock;

struct Job {
  enum class Kind { read, write, publish, erase, exists, lookup, barrier } kind = Kind::read;
  std::vector<std::string> keys;
  std::vector<std::byte> values;  // write/publish: encoded values, value_bytes each
  std::vector<std::byte*> dst;    // read
  std::vector<RemoteRead> outcomes;
  struct {
    std::vector<PrefixDigest> chain;  // the page digests to look for, in order
    std::uint32_t layers = 0, heads = 0;
  } lookup;
  std::size_t stored = 0;
  std::uint32_t found = 0;
  std::string why;       // the last connection or reply error
  bool replied = false;  // the server has answered part of it
  bool done = false;
};

}  // namespace kvdrive::tier::redis
