// Sharing prompt prefixes through a remote tier (docs/remote.md): prefill publishes the sealed
// pages inside a sequence's shared prefix, and load_prefix() reads the longest run of them that
// the remote tier holds for every layer and head, then prefills the sequence with it, so the
// engine computes only the tokens after. Pages are addressed by a chain of content keys
// (page_chain): page p's key digests page p-1's key and page p's tokens, starting from this
// manager's page layout, so two prompts share exactly their common leading whole pages,
// whatever follows them, and managers that lay pages out differently never share.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <vector>

#include "kvdrive/core/config.hpp"
#include "kvdrive/core/digest.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/view.hpp"
#include "kvdrive/manager/page_store.hpp"
#include "kvdrive/tier/remote.hpp"

namespace kvdrive::manager {

/// What load_prefix() did.
struct PrefixLoad {
  std::uint32_t pages_found = 0;   ///< leading pages the remote tier listed for every stream
  std::uint32_t pages_loaded = 0;  ///< of those, pages read and verified for every stream
  std::int64_t tokens = 0;         ///< tokens now in every layer (pages_loaded x page_tokens)
};

/// The layout every chain starts from: this manager's shape, page size and KV dtype, so pages
/// only meet managers that store them alike.
inline PrefixDigest layout_digest(const Config& cfg) {
  const std::int64_t layout[] = {cfg.shape.layers,   cfg.shape.q_heads, cfg.shape.kv_heads,
                                 cfg.shape.head_dim, cfg.page_tokens,   static_cast<std::int64_t>(cfg.dtype)};
  return PrefixDigest::of_bytes(layout, sizeof layout);
}

/// The chained keys of a prompt's whole pages: key[p] digests key[p-1] (the layout's digest for
/// p = 0) and the token ids of page p, so it names pages 0..p exactly. A trailing part page has
/// no key (it is not sealed by the prompt alone). Each key's `tokens` is the tokens it covers.
inline std::vector<PrefixDigest> page_chain(const Config& cfg, std::span<const std::int32_t> tokens) {
  const auto pt = static_cast<std::size_t>(cfg.page_tokens);
  std::vector<PrefixDigest> chain(std::min<std::size_t>(tokens.size() / pt, UINT32_MAX));
  std::vector<std::int64_t> buf(2 + pt);
  PrefixDigest prev = layout_digest(cfg);
  for (std::size_t p = 0; p < chain.size(); ++p) {
    buf[0] = static_cast<std::int64_t>(prev.low), buf[1] = static_cast<std::int64_t>(prev.high);
    std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(p * pt), pt, buf.begin() + 2);
    prev = chain[p] = PrefixDigest::of_bytes(buf.data(), buf.size() * sizeof buf[0], static_cast<std::int64_t>((p + 1) * pt));
  }
  return chain;
}

/// The keys of the whole pages inside a prefix known only by an opaque digest: each mixes the
/// layout, the digest and the page number, so they meet only a prefix with the same digest.
inline std::vector<PrefixDigest> opaque_chain(const Config& cfg, const PrefixDigest& prefix) {
  const PrefixDigest layout = layout_digest(cfg);
  std::vector<PrefixDigest> chain(static_cast<std::size_t>(std::clamp<std::int64_t>(prefix.tokens / cfg.page_tokens, 0, UINT32_MAX)));
  for (std::size_t p = 0; p < chain.size(); ++p) {
    const std::int64_t mix[] = {static_cast<std::int64_t>(layout.low),
                                static_cast<std::int64_t>(layout.high),
                                static_cast<std::int64_t>(prefix.low),
                                static_cast<std::int64_t>(prefix.high),
                                prefix.tokens,
                                static_cast<std::int64_t>(p)};
    chain[p] = PrefixDigest::of_bytes(mix, sizeof mix, static_cast<std::int64_t>(p + 1) * cfg.page_tokens);
  }
  return chain;
}

/// A new sequence shares the whole pages of its prompt prefix (when there is a remote tier): by
/// their token ids, or by an opaque digest of the prefix.
template <class Seq>
void mark_shared(const Config& cfg, Seq& s, std::span<const std::int32_t> tokens) {
  s.shared_chain = page_chain(cfg, tokens);
}
template <class Seq>
void mark_shared(const Config& cfg, Seq& s, const std::optional<PrefixDigest>& digest) {
  if (digest) s.shared_chain = opaque_chain(cfg, *digest);
}

/// Hands the sealed pages inside the sequence's shared prefix to the remote tier (best effort,
/// in the background: it copies them and never throws for the server's trouble).
template <class Core>
void publish_prefix_pages(Core& c, const typename Core::SequenceT& seq, std::span<const SealedPage> seals) noexcept {
  if constexpr (Core::kRemote) {
    if (c.remote == nullptr || seq.shared_chain.empty()) return;
    try {
      std::vector<tier::WriteRequest> pages;
      for (const SealedPage& p : seals)
        if (p.key.page < seq.shared_chain.size() && p.key.page >= seq.loaded_pages) pages.push_back({p.key, p.bytes});
      c.remote->publish(tier::PageChain(seq.shared_chain), pages);
    } catch (...) {  // out of memory: not sharing these pages is allowed; prefill goes on
    }
  } else {
    (void)c, (void)seq, (void)seals;
  }
}

/// load_prefix(): reads a run of shared pages and prefills a sequence from it.
template <class Core>
class PrefixLoader {
 public:
  PrefixLoader(Core& c, PageStore<Core>& store) : c_(c), store_(store) {}

  /// prefill(layer, k, v) appends a chunk; on_layer(layer, k, v) sees each layer's keys and values.
  template <class Prefill, class OnLayer>
  PrefixLoad run(SeqId id, std::int64_t max_tokens, std::int64_t chunk, Prefill&& prefill, OnLayer&& on_layer) {
    KVD_EXPECT(chunk >= 1 && chunk <= (std::int64_t{1} << 30), "load_prefix: chunk {} must be in 1..2^30 (the engine's tokens per prefill call)",
               chunk);
    auto& seq = c_.sequences.usable(id);
    for (int l = 0; l < c_.cfg.shape.layers; ++l) {
      const std::int64_t held = c_.stream(seq, l, 0).pages.tokens;
      KVD_EXPECT(held == 0, "load_prefix: sequence {} layer {} already holds {} tokens; load the prefix first", id, l, held);
    }
    PrefixLoad r;
    const int pt = c_.cfg.page_tokens;
    if (c_.remote == nullptr || seq.shared_chain.empty() || max_tokens < pt) return r;
    // Runs are cut to whole chunks (which are whole pages too) before anything is read.
    unit_ = std::lcm<std::int64_t>(chunk, pt);
    const std::uint32_t max_pages = cut(std::min<std::int64_t>(static_cast<std::int64_t>(seq.shared_chain.size()), max_tokens / pt));
    if (max_pages == 0) return r;
    const auto layers = static_cast<std::uint32_t>(c_.cfg.shape.layers), kvh = static_cast<std::uint32_t>(c_.cfg.shape.kv_heads);
    const tier::PageChain chain = tier::PageChain(seq.shared_chain).first(max_pages);
    r.pages_found = std::min(max_pages, c_.remote->lookup(chain, layers, kvh));
    want_ = cut(r.pages_found);
    if (want_ == 0) return r;
    const std::uint32_t run = cut(read_run(id, chain));
    r.pages_loaded = run;
    r.tokens = static_cast<std::int64_t>(run) * pt;
    if (run == 0) return r;
    seq.loaded_pages = run;  // prefill need not publish them again
    prefill_from_pages(r.tokens, chunk, prefill, on_layer);
    return r;
  }

 private:
  std::uint32_t cut(std::int64_t pages) const {
    const int pt = c_.cfg.page_tokens;
    return static_cast<std::uint32_t>(pages * pt / unit_ * unit_ / pt);
  }
  std::size_t per_layer() const { return static_cast<std::size_t>(c_.cfg.shape.kv_heads) * want_; }
  std::byte* page(int layer, int head, std::uint32_t p) {
    const std::size_t i = static_cast<std::size_t>(layer) * per_layer() + static_cast<std::size_t>(head) * want_ + p;
    return bytes_.data() + i * store_.page_bytes();
  }

  /// Reads want_ leading pages of every stream, every layer's reads queued at once; returns the
  /// run that every stream read and verified.
  std::uint32_t read_run(SeqId id, tier::PageChain chain) {
    const int layers = c_.cfg.shape.layers, kvh = c_.cfg.shape.kv_heads;
    const std::size_t pb = store_.page_bytes();
    bytes_.assign(static_cast<std::size_t>(layers) * per_layer() * pb, std::byte{0});
    std::vector<tier::ReadRequest> reads(per_layer());
    Tickets t{*c_.remote, {}, 0, std::vector<tier::RemoteRead>(per_layer())};
    t.tickets.reserve(static_cast<std::size_t>(layers));
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < kvh; ++h)
        for (std::uint32_t p = 0; p < want_; ++p)
          reads[static_cast<std::size_t>(h) * want_ + p] = {tier::PageKey{id, static_cast<std::uint32_t>(l), static_cast<std::uint32_t>(h), p},
                                                            page(l, h, p)};
      t.tickets.push_back(c_.remote->submit(chain, reads));
    }
    std::uint32_t run = want_;
    for (int l = 0; l < layers; ++l) {
      c_.remote->wait_each(t.tickets[static_cast<std::size_t>(l)], t.outcome);
      t.waited = static_cast<std::size_t>(l) + 1;
      for (int h = 0; h < kvh; ++h)
        for (std::uint32_t p = 0; p < run; ++p)
          if (t.outcome[static_cast<std::size_t>(h) * want_ + p] != tier::RemoteRead::hit) run = p;
    }
    return run;
  }

  /// Reads in flight write into bytes_: if anything throws before they are waited for, they are
  /// waited for on the way out.
  struct Tickets {
    typename Core::Remote& remote;
    std::vector<tier::ReadTicket> tickets;
    std::size_t waited;
    std::vector<tier::RemoteRead> outcome;
    ~Tickets() {
      for (; waited < tickets.size(); ++waited) try {
          remote.wait_each(tickets[waited], outcome);
        } catch (...) {
        }
    }
  };

  /// Prefills every layer from the run's pages in `chunk`-token calls: float is exact for every
  /// KV dtype, so the stored bytes come out the same as the publisher's, and the index sees the
  /// same keys.
  template <class Prefill, class OnLayer>
  void prefill_from_pages(std::int64_t tokens, std::int64_t chunk, Prefill& prefill, OnLayer& on_layer) {
    const int kvh = c_.cfg.shape.kv_heads, pt = c_.cfg.page_tokens, d = c_.cfg.shape.head_dim;
    const auto run = static_cast<std::uint32_t>(tokens / pt);
    std::vector<float> k(static_cast<std::size_t>(tokens) * kvh * d), v(k.size()), row(static_cast<std::size_t>(pt) * d);
    for (int l = 0; l < c_.cfg.shape.layers; ++l) {
      for (int h = 0; h < kvh; ++h)
        for (std::uint32_t p = 0; p < run; ++p)
          for (int half = 0; half < 2; ++half) {
            store_.decode_block(page(l, h, p) + half * c_.cfg.block_bytes(), row.data(), row.size());
            std::vector<float>& dst = half == 0 ? k : v;
            for (int t = 0; t < pt; ++t)
              std::copy_n(row.data() + static_cast<std::size_t>(t) * d, d, dst.data() + ((static_cast<std::size_t>(p) * pt + t) * kvh + h) * d);
          }
      const auto kv = make_view(std::as_const(k).data(), tokens, kvh, d), vv = make_view(std::as_const(v).data(), tokens, kvh, d);
      for (std::int64_t t0 = 0; t0 < tokens; t0 += chunk) {
        const std::int64_t n = std::min(chunk, tokens - t0);
        const std::size_t at = static_cast<std::size_t>(t0) * kvh * d;
        prefill(l, make_view(kv.data + at, n, kvh, d), make_view(vv.data + at, n, kvh, d));
      }
      on_layer(l, kv, vv);
    }
  }

  Core& c_;
  PageStore<Core>& store_;
  std::int64_t unit_ = 1;
  std::uint32_t want_ = 0;
  std::vector<std::byte> bytes_;
};

}  // namespace kvdrive::manager
