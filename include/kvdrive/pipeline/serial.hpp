// pipeline::Serial: every stage for every stream, one stage after another, then compute for the
// whole batch and commit. The reference every other pipeline must match bit for bit.
#pragma once

#include <cstddef>
#include <string_view>

#include "kvdrive/pipeline/concept.hpp"

namespace kvdrive::pipeline {

struct Serial {
  static constexpr std::string_view name() { return "serial"; }

  template <StepStages S>
  void run(S& s) const {
    const std::size_t n = s.streams();
    for (std::size_t i = 0; i < n; ++i) s.select(i);
    for (std::size_t i = 0; i < n; ++i) s.classify(i);
    for (std::size_t i = 0; i < n; ++i) s.fetch(i);
    s.compute(0, n);
    s.commit();
  }
};
static_assert(PipelinePolicy<Serial>);

}  // namespace kvdrive::pipeline
