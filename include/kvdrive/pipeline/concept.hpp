// PipelinePolicy: how the five stages of one attend() step run (Decision 1). KvManager hands the
// pipeline a StepStages object over n streams (sequence x KV head of one layer):
//   select(i)   index -> candidate pages within budget          (per stream, commits nothing)
//   select_range(a, b) the same for streams [a, b), in one call where the index selects many
//                      streams at once (a GPU launch), else in parallel (optional)
//   classify(i) cache  -> hits and misses                       (per stream, commits nothing)
//   fetch(i)    tiers  -> staging slots for the misses          (per stream, commits nothing)
//   fetch_range(a, b)  the same for streams [a, b), their reads in flight together (optional)
//   fetch_start(a, b) / fetch_finish(a, b)  fetch_range in two halves: start the reads, and
//                      later wait for them, so other ranges can be read meanwhile (optional)
//   prepare_commit()   commit's fallible part: seal writes; may overlap compute (optional)
//   compute(a, b) attention for streams [a, b) over page pointers
//   commit()    append K/V, seal, extend the index, update eviction: all or nothing
// A pipeline may interleave select/classify/fetch of different streams, or run one stage for
// many streams at once on the backend's threads (parallel_for; select and classify of different
// streams are independent), but must run compute for a stream only after its fetch, and commit
// once after every compute. It records each stage's wall time in times(). If any stage throws,
// the pipeline stops, joins its threads, and lets the exception reach attend(), which rolls back.
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <string_view>

#include "kvdrive/core/stats.hpp"

namespace kvdrive::pipeline {

template <class S>
concept StepStages = requires(S& s, std::size_t i, const std::function<void(std::size_t)>& fn) {
  { s.streams() } -> std::convertible_to<std::size_t>;
  s.select(i);
  s.classify(i);
  s.fetch(i);
  s.compute(i, i);
  s.commit();
  s.parallel_for(i, fn);
  { s.times() } -> std::same_as<StageTimes&>;
};

// The optional capabilities of a step, by name: a pipeline asks for them with these concepts, and
// a wrapper of a step (the tuner's dry run) checks that it offers the ones the step offers.

/// select_range(a, b): streams [a, b) selected in one call (a batch-selecting index) or in parallel.
template <class S>
concept RangeSelect = requires(S& s, std::size_t i) {
  s.select_range(i, i);
};

/// fetch_range(a, b): the misses of streams [a, b) read with their reads in flight together.
template <class S>
concept RangeFetch = requires(S& s, std::size_t i) {
  s.fetch_range(i, i);
};

/// fetch_start(a, b) / fetch_finish(a, b): a range's reads started, and later waited for.
template <class S>
concept AsyncFetch = requires(S& s, std::size_t i) {
  s.fetch_start(i, i);
  s.fetch_finish(i, i);
};

/// compute_ready(a, b): the splits whose pages are all resident attended while the misses are read.
template <class S>
concept EarlyCompute = AsyncFetch<S> && requires(S& s, std::size_t i) {
  s.compute_ready(i, i);
};

/// prepare_commit(): commit's fallible part (seal writes), run early, overlapping compute.
template <class S>
concept PreparedCommit = requires(S& s) {
  s.prepare_commit();
};

/// The smallest type satisfying StepStages; used to check pipelines against the concept.
struct StagesArchetype {
  StageTimes t;
  std::size_t streams() { return 0; }
  void parallel_for(std::size_t, const std::function<void(std::size_t)>&) {}
  StageTimes& times() { return t; }
  void select(std::size_t) {}
  void classify(std::size_t) {}
  void fetch(std::size_t) {}
  void compute(std::size_t, std::size_t) {}
  void commit() {}
};

template <class P>
concept PipelinePolicy = std::copy_constructible<P> && requires(const P& p, StagesArchetype& s) {
  { P::name() } -> std::convertible_to<std::string_view>;
  p.run(s);
};

}  // namespace kvdrive::pipeline
