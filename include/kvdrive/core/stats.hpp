// Stats: what one attend() step did and how long each stage took. KvManager keeps the last
// step's record and a running total. Hit counts cover index-selected pages only (Decision 3).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace kvdrive {

inline constexpr std::size_t kMaxTiers = 8;

/// Where a step's time went. The *_ms of each stage is its busy time (summed over the threads
/// that ran it one after another). A pipeline that overlaps select, classify and fetch also
/// records how long classify and fetch waited for their input, and the wall time of that
/// overlapped phase; a stage's bubble fraction is the share of the phase it was not busy.
struct StageTimes {
  double select_ms = 0, classify_ms = 0, fetch_ms = 0, compute_ms = 0, commit_ms = 0;
  double classify_wait_ms = 0, fetch_wait_ms = 0;  ///< waiting for the previous stage
  double overlap_ms = 0;                           ///< wall time from the first select to the last fetch
  double wall_ms = 0;                              ///< wall time of the whole step

  /// The stages' busy time, as if they ran one after another.
  double total_ms() const { return select_ms + classify_ms + fetch_ms + compute_ms + commit_ms; }
  /// Share of the overlapped phase a stage was idle: 1 - busy / overlap (0 when none ran).
  static double bubble(double busy_ms, double overlap) { return overlap > 0 ? 1.0 - busy_ms / overlap : 0.0; }
  double select_bubble() const { return bubble(select_ms, overlap_ms); }
  double classify_bubble() const { return bubble(classify_ms, overlap_ms); }
  double fetch_bubble() const { return bubble(fetch_ms, overlap_ms); }

  StageTimes& operator+=(const StageTimes& o) {
    select_ms += o.select_ms;
    classify_ms += o.classify_ms;
    fetch_ms += o.fetch_ms;
    compute_ms += o.compute_ms;
    commit_ms += o.commit_ms;
    classify_wait_ms += o.classify_wait_ms;
    fetch_wait_ms += o.fetch_wait_ms;
    overlap_ms += o.overlap_ms;
    wall_ms += o.wall_ms;
    return *this;
  }
};

struct Stats {
  std::uint64_t steps = 0;           ///< attend() calls summed into this record
  std::uint64_t streams = 0;         ///< streams (sequence x KV head) processed
  std::uint64_t candidates = 0;      ///< index candidate pages
  std::uint64_t selected = 0;        ///< pages the index selected
  std::uint64_t hits = 0;            ///< selected pages already in fast memory (cached or in place)
  std::uint64_t in_place = 0;        ///< of the hits: pages attended where they live (host tiers)
  std::uint64_t misses = 0;          ///< selected pages fetched from a slower tier
  std::uint64_t evictions = 0;       ///< pages that left the fast-tier cache
  std::uint64_t warmed = 0;          ///< pages read into the cache by warm-up (KvManager::warm_up)
  std::uint64_t placed = 0;          ///< pages warm-up copied into a middle tier by importance
  std::uint64_t packed = 0;          ///< pages warm-up rewrote on the last tier grouped by cluster
  std::uint64_t attended_pages = 0;  ///< sink + selected + local pages attended
  std::uint64_t attended_tokens = 0;
  std::array<std::uint64_t, kMaxTiers> bytes_read{};     ///< per tier index in Tiers<...>
  std::array<std::uint64_t, kMaxTiers> bytes_written{};  ///< per tier index in Tiers<...>
  StageTimes time;

  double hit_rate() const { return selected ? static_cast<double>(hits) / static_cast<double>(selected) : 1.0; }

  Stats& operator+=(const Stats& o) {
    steps += o.steps;
    streams += o.streams;
    candidates += o.candidates;
    selected += o.selected;
    hits += o.hits;
    in_place += o.in_place;
    misses += o.misses;
    evictions += o.evictions;
    warmed += o.warmed;
    placed += o.placed;
    packed += o.packed;
    attended_pages += o.attended_pages;
    attended_tokens += o.attended_tokens;
    for (std::size_t i = 0; i < kMaxTiers; ++i) {
      bytes_read[i] += o.bytes_read[i];
      bytes_written[i] += o.bytes_written[i];
    }
    time += o.time;
    return *this;
  }
};

}  // namespace kvdrive
