// The structured strings of the command lines: "synthetic:NAME[:seed=N]" (kvd-llama --model,
// kvd-eval --trace; eval::parse_synthetic_spec). Any string gives nullopt, a kvdrive::Error, or
// a spec that spells back to itself: synthetic:NAME:seed=N parses to the same name and seed.
#include <cstdlib>
#include <string>

#include "kvdrive/eval/synthetic_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto spec = kvdrive::eval::parse_synthetic_spec(text, "--fuzz");
    if (!spec) return 0;
    if (spec->preset.empty() || spec->preset.find(':') != std::string::npos) std::abort();
    const auto again = kvdrive::eval::parse_synthetic_spec("synthetic:" + spec->preset + ":seed=" + std::to_string(spec->seed), "--fuzz");
    if (!again || again->preset != spec->preset || again->seed != spec->seed) std::abort();
  } catch (const kvdrive::Error&) {
  }
  return 0;
}
