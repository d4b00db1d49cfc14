// kvd-longbench --fidelity: how far sparse decoding departs from dense on long real documents,
// teacher-forced. A document is prefilled once (dense) up to its last position; at each measured
// position P the first P tokens' K/V (the same bits a P-token prefill gives) start every
// configuration, which then steps through the document's next tokens; each step's next-token
// distribution is compared with dense's at the same position: mean KL(dense || sparse) in nats,
// top-1 agreement, and the perplexity of the document's own tokens under each.
//
// Documents (from the machine, so every run reads the same text):
//   python    Python's standard library sources (/usr/lib/python3.*/ *.py in name order)
//   licences  the licence texts of /usr/share/common-licenses (the retrieval haystack)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/needle.hpp"
#include "replay.hpp"
#include "stats.hpp"

namespace kvdrive::longbench {

struct FidelityDoc {
  std::string name;
  std::string text;
  std::string source;  ///< where the text came from, for the report
};

/// The standard library folder of the machine's Python 3 (the one holding argparse.py).
inline std::filesystem::path python_stdlib_dir() {
  std::vector<std::filesystem::path> dirs;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/usr/lib", ec))
    if (e.path().filename().string().starts_with("python3") && std::filesystem::exists(e.path() / "argparse.py")) dirs.push_back(e.path());
  KVD_EXPECT(!dirs.empty(), "--fidelity: no Python 3 standard library under /usr/lib (python3.*/argparse.py)");
  std::sort(dirs.begin(), dirs.end());
  return dirs.back();
}

/// The document `name` (python or licences), at least `bytes` long where the machine has that much.
inline FidelityDoc fidelity_document(const std::string& name, std::size_t bytes) {
  FidelityDoc d{name, {}, {}};
  if (name == "licences") {
    for (const auto& p : llama::haystack_paragraphs(llama::NeedleSpec{}.dir)) d.text += (d.text.empty() ? "" : "\n\n") + p;
    d.source = llama::NeedleSpec{}.dir;
  } else {
    KVD_EXPECT(name == "python", "--fidelity-docs: unknown document '{}' (python, licences)", name);
    const std::filesystem::path dir = python_stdlib_dir();
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() == ".py") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      if (d.text.size() >= bytes) break;
      d.text += llama::read_text_file(f.string());
    }
    d.source = dir.string() + "/*.py";
  }
  return d;
}

/// One (document, position, configuration)'s figures against dense.
struct FidelityCell {
  std::string doc, config;
  std::int64_t position = 0, tokens = 0;  ///< the first measured position, positions measured
  double kl = 0;                          ///< mean KL(dense || config), nats
  double top1 = 0;                        ///< fraction of positions with dense's top-1
  double ppl = 0, dense_ppl = 0;          ///< perplexity of the document's tokens
  double ms_per_token = 0;
};

/// The figures of `sparse` against `dense` over forced tokens whose next tokens are `targets`.
inline FidelityCell compare_replays(const Replay& dense, const Replay& sparse, std::span<const int> targets) {
  FidelityCell c;
  double kl = 0, top1 = 0, nll = 0, dense_nll = 0;
  const std::size_t n = std::min({dense.logits.size(), sparse.logits.size(), targets.size()});
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<double> lp = log_softmax(dense.logits[i]), lq = log_softmax(sparse.logits[i]);
    kl += kl_divergence(lp, lq);
    top1 += detail::argmax(dense.logits[i]) == detail::argmax(sparse.logits[i]);
    dense_nll -= lp[static_cast<std::size_t>(targets[i])];
    nll -= lq[static_cast<std::size_t>(targets[i])];
  }
  const double d = static_cast<double>(std::max<std::size_t>(1, n));
  c.tokens = static_cast<std::int64_t>(n);
  c.kl = kl / d, c.top1 = top1 / d, c.ppl = std::exp(nll / d), c.dense_ppl = std::exp(dense_nll / d);
  c.ms_per_token = sparse.decode_ms / static_cast<double>(std::max<std::int64_t>(1, sparse.steps));
  return c;
}

struct FidelityPlan {
  std::vector<std::string> docs;
  std::vector<std::int64_t> positions;
  int forced = 32;  ///< tokens stepped through at each position
  std::vector<ConfigSpec> configs;
};

/// Runs the plan; progress(done, total) after each configuration.
template <class Tok, class Progress>
std::vector<FidelityCell> run_fidelity(const ReplayContext& cx, const Tok& tok, const FidelityPlan& plan, Progress&& progress) {
  std::vector<FidelityCell> cells;
  const std::int64_t last = *std::max_element(plan.positions.begin(), plan.positions.end());
  const std::int64_t need = last + plan.forced + 1;
  const std::size_t total = plan.docs.size() * plan.positions.size() * plan.configs.size();
  std::size_t done = 0;
  for (const auto& name : plan.docs) {
    const FidelityDoc doc = fidelity_document(name, static_cast<std::size_t>(need) * 6);
    const std::vector<int> ids = tok.encode(doc.text, tok.adds_bos(doc.text), false);
    KVD_EXPECT(static_cast<std::int64_t>(ids.size()) >= need, "--fidelity: {} holds {} tokens, fewer than the {} position {} needs", doc.source,
               ids.size(), need, last);
    // One dense prefill up to the last position; its first P tokens start each position.
    llama::PrefillSnapshot full;
    {
      KvManager<index::Dense, eviction::None> kv(llama::manager_config(cx.layout, cx.model->config));
      llama::Decoder<decltype(kv)> dec(*cx.model, kv, *cx.pool, cx.layout.attention.prefill_chunk);
      dec.keep_prefill(&full);
      dec.prefill(std::span<const int>(ids.data(), static_cast<std::size_t>(last)));
    }
    for (std::int64_t p : plan.positions) {
      const llama::PrefillSnapshot snap = truncate(full, p, full.logits);
      const std::span<const int> forced(ids.data() + p, static_cast<std::size_t>(plan.forced));
      const std::span<const int> targets(ids.data() + p + 1, static_cast<std::size_t>(plan.forced));
      ReplayPlan rp;
      rp.forced = forced;
      const Replay dense = replay(cx, ConfigSpec{}, snap, rp);
      for (const auto& c : plan.configs) {
        FidelityCell cell = compare_replays(dense, c == ConfigSpec{} ? dense : replay(cx, c, snap, rp), targets);
        cell.doc = name, cell.config = c.name(), cell.position = p;
        cells.push_back(cell);
        progress(++done, total);
      }
    }
  }
  return cells;
}

}  // namespace kvdrive::longbench
