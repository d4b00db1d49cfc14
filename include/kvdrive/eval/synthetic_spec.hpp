// The command-line spelling of a seeded synthetic source, "synthetic:NAME[:seed=N]", as kvd-llama
// (--model, a synthetic model) and kvd-eval (--trace, a synthetic trace) take it. One parser, so
// both accept and refuse the same strings with the same messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kvdrive/core/error.hpp"

namespace kvdrive::eval {

struct SyntheticSpec {
  std::string preset;
  std::uint64_t seed = 1;
};

/// nullopt when `text` does not start with "synthetic:" (a file path, say); the spec when it is
/// synthetic:NAME or synthetic:NAME:seed=N (N a decimal integer of at most 19 digits); else
/// throws kvdrive::Error naming `option` (e.g. "--trace") and what was expected.
inline std::optional<SyntheticSpec> parse_synthetic_spec(std::string_view text, std::string_view option) {
  constexpr std::string_view kPrefix = "synthetic:";
  if (text.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::string_view rest = text.substr(kPrefix.size());
  const std::size_t colon = rest.find(':');
  SyntheticSpec s;
  s.preset = std::string(rest.substr(0, colon));
  KVD_EXPECT(!s.preset.empty(), "{} '{}': no name after 'synthetic:' (expected synthetic:NAME or synthetic:NAME:seed=N)", option, text);
  if (colon != std::string_view::npos) {
    const std::string_view opt = rest.substr(colon + 1), num = opt.substr(std::min<std::size_t>(5, opt.size()));
    KVD_EXPECT(opt.substr(0, 5) == "seed=" && !num.empty() && num.size() <= 19 && num.find_first_not_of("0123456789") == std::string_view::npos,
               "{} '{}': expected synthetic:NAME or synthetic:NAME:seed=N (N a non-negative integer of at most 19 digits)", option, text);
    s.seed = std::stoull(std::string(num));
  }
  return s;
}

}  // namespace kvdrive::eval
