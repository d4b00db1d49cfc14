// kvd-llama's decoding loop: tokens sampled from the logits, the reply streamed as it is
// generated (with a tokenizer) or a progress bar drawn, until --steps or an end-of-generation
// token.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "app/run_options.hpp"
#include "app/run_prompt.hpp"
#include "decoder/sampler.hpp"
#include "tokenizer/tokenizer.hpp"

namespace kvdrive::llama {

/// A one-line progress bar on stderr, drawn only when stderr is a terminal.
class Progress {
 public:
  explicit Progress(std::string label) : label_(std::move(label)), enabled_(::isatty(2) != 0) {}
  void update(std::int64_t done, std::int64_t total) {
    if (!enabled_) return;
    const int width = 40, filled = total ? static_cast<int>(width * done / total) : width;
    fmt::print(stderr, "\r{:>8} [{}{}] {}/{}", label_, std::string(static_cast<std::size_t>(filled), '#'),
               std::string(static_cast<std::size_t>(width - filled), ' '), done, total);
    if (done == total) fmt::print(stderr, "\n");
  }

 private:
  std::string label_;
  bool enabled_;
};

/// What decoding gave: the ids, the reply's text (with a tokenizer), and whether an
/// end-of-generation token ended it.
struct Decoded {
  std::vector<int> generated;
  std::string reply;
  bool ended = false;
};

/// Samples up to --steps tokens from `logits` (prefill's) on. With a tokenizer, the reply is
/// printed as it is generated (unless `print_ids`: --print-ids prints the ids alone, after), and
/// generation ends at an end-of-generation token (EOS, EOT; not printed) unless --ignore-eos.
template <class Dec>
Decoded decode(const SamplingOptions& o, bool print_ids, const std::optional<Tokenizer>& tokenizer, const PromptInput& in, Dec& decoder,
               const std::vector<float>* logits) {
  Progress decode_bar("decode");
  Sampler sampler(o.temperature, o.top_p, o.seed);
  const bool stream = tokenizer && !print_ids;
  const std::vector<int> stops = stop_tokens(o, tokenizer);
  Decoded out;
  if (stream) fmt::print("reply: {}", in.text.reply_prefix), std::fflush(stdout);
  for (int s = 0; s < o.steps; ++s) {
    const int next = sampler.sample(*logits);
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) {
      out.ended = true;
      break;
    }
    out.generated.push_back(next);
    if (tokenizer) {
      const std::string piece = tokenizer->decode(out.generated.size() > 1 ? out.generated[out.generated.size() - 2] : in.ids.back(), next);
      out.reply += piece;
      if (stream) fmt::print("{}", piece), std::fflush(stdout);
    }
    if (!stream) decode_bar.update(s + 1, o.steps);  // a bar would overwrite the streamed reply
    if (s + 1 < o.steps) logits = &decoder.step(next);
  }
  if (stream) fmt::print("{}\n", out.ended ? "" : fmt::format(" [{} tokens, no end-of-generation token]", out.generated.size()));
  return out;
}

inline void print_ids_line(const std::vector<int>& generated) {
  std::string line;
  for (std::size_t i = 0; i < generated.size(); ++i) line += fmt::format("{}{}", i ? " " : "", generated[i]);
  fmt::print("{}\n", line);
}

}  // namespace kvdrive::llama
