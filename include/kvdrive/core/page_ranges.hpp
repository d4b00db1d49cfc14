// Which pages of a stream are sink, index candidates and local (DESIGN Decision 3).
// For a stream of n tokens (the token being decoded included), with P = ceil(n / page_tokens):
//   sink       [0, sink_end)          pages holding any of the first sink_tokens
//   candidates [sink_end, local_begin) sealed pages the index chooses among
//   local      [local_begin, P)        pages overlapping the last local_tokens, and the tail page
// The three ranges are disjoint and cover every page, so every token is attended exactly once.
#pragma once

#include <cstdint>

#include "kvdrive/core/host_device.hpp"

namespace kvdrive {

struct PageRanges {
  std::int64_t sink_end = 0;
  std::int64_t local_begin = 0;
  std::int64_t pages = 0;

  KVD_HOST_DEVICE std::int64_t candidates() const { return local_begin - sink_end; }
};

KVD_HOST_DEVICE PageRanges page_ranges(std::int64_t tokens, std::int64_t page_tokens, std::int64_t sink_tokens, std::int64_t local_tokens) {
  PageRanges r;
  if (tokens <= 0) return r;
  r.pages = (tokens + page_tokens - 1) / page_tokens;
  const std::int64_t sink_pages = (sink_tokens + page_tokens - 1) / page_tokens;
  r.sink_end = sink_pages < r.pages ? sink_pages : r.pages;
  const std::int64_t local_first_token = tokens > local_tokens ? tokens - local_tokens : 0;
  std::int64_t local_begin = local_first_token / page_tokens;
  const std::int64_t tail_page = (tokens - 1) / page_tokens;  // holds the newest token
  if (local_begin > tail_page) local_begin = tail_page;
  r.local_begin = local_begin > r.sink_end ? local_begin : r.sink_end;
  return r;
}

}  // namespace kvdrive
