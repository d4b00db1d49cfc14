// Prefill: a layer's prompt keys and values, appended to each of its streams (KvManager::prefill).
// The fallible part writes every head's tokens into fresh slots (through the PageStore: host
// slots, or host pages uploaded to a device fast tier), then stores the pages this call seals on
// the backing tiers, all heads together (one sync per tier), and offers the shared ones to the
// remote tier. Past the point of no return the streams take their slots, homes and tokens, and
// the index is built or extended with the sealed pages' keys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <utility>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/view.hpp"
#include "kvdrive/manager/checks.hpp"
#include "kvdrive/manager/page_edit.hpp"
#include "kvdrive/manager/page_store.hpp"

namespace kvdrive::manager {

template <class Core>
class Prefill {
 public:
  using Store = PageStore<Core>;
  using StreamT = typename Core::StreamT;

  Prefill(Core& c, Store& store) : c_(c), store_(store) {}

  /// Appends k and v ([tokens][kv_heads][head_dim] floats) to every stream of the layer.
  /// publish(seq, seals) offers the sealed pages to a remote tier (never throws).
  template <class Publish>
  void run(SeqId id, int layer, View<const float, 3> k, View<const float, 3> v, Publish&& publish) {
    c_.check_layer(layer);
    auto& seq = c_.sequences.usable(id);
    check_kv_view(c_.cfg, k, "prefill: k", -1);
    check_kv_view(c_.cfg, v, "prefill: v", -1);
    KVD_EXPECT(k.extent(0) == v.extent(0), "prefill: k has {} tokens but v has {}", k.extent(0), v.extent(0));
    const int kvh = c_.cfg.shape.kv_heads;
    for (int h = 0; h < kvh; ++h)
      KVD_EXPECT(c_.stream(seq, layer, h).steps == 0, "prefill: sequence {} layer {} has already decoded; prefill comes first", id, layer);
    if (k.extent(0) == 0) return;

    PageEdit<typename Core::TierList> edit(c_.tiers);
    std::vector<Head> heads;
    heads.reserve(static_cast<std::size_t>(kvh));  // the seals point into them
    std::vector<SealedPage> seals;
    for (int h = 0; h < kvh; ++h) {
      StreamT& st = c_.stream(seq, layer, h);
      heads.emplace_back(store_, st, k.extent(0), c_.cfg.page_tokens);
      write_head(heads.back(), edit, tier::PageKey{id, static_cast<std::uint32_t>(layer), static_cast<std::uint32_t>(h), 0}, k, v, h, seals);
    }
    store_.store_sealed(seals, edit, false);
    publish(seq, std::as_const(seals));
    commit(seq, layer, id, heads, seals, edit);
  }

 private:
  /// One head's part of the call.
  struct Head {
    Head(Store& store, StreamT& s, std::int64_t n, int pt)
        : st(&s),
          first_page(s.pages.tokens / pt),
          end_page((s.pages.tokens + n + pt - 1) / pt),
          tokens_after(s.pages.tokens + n),
          pages(store, s, first_page, end_page) {}
    StreamT* st;
    std::int64_t first_page, end_page, tokens_after;
    typename Store::PrefillPages pages;  ///< where the call writes the head's pages
    std::vector<Slot> new_slots;         ///< slots of pages this call opens
    std::vector<std::uint32_t> sealed;   ///< pages this call seals
    std::vector<float> keys;             ///< the sealed pages' keys, as float, for the index

    Slot slot_of(std::int64_t page) const {
      const auto have = static_cast<std::int64_t>(st->pages.size());
      return page < have ? st->pages[static_cast<std::size_t>(page)].slot : new_slots[static_cast<std::size_t>(page - have)];
    }
    std::byte* bytes(std::int64_t page) { return pages.page(page, slot_of(page)); }
  };

  /// Writes head h's tokens into its pages (fresh slots from the edit where a page starts) and
  /// appends the pages it seals to `seals`, with their keys for the index.
  void write_head(Head& w, PageEdit<typename Core::TierList>& edit, const tier::PageKey& base, View<const float, 3> k, View<const float, 3> v, int h,
                  std::vector<SealedPage>& seals) {
    const int pt = c_.cfg.page_tokens;
    const std::int64_t tokens = w.st->pages.tokens;
    for (std::int64_t t = 0; t < k.extent(0); ++t) {
      const std::int64_t pos = tokens + t, page = pos / pt;
      const int row = static_cast<int>(pos % pt);
      if (page >= static_cast<std::int64_t>(w.st->pages.size()) && row == 0) {
        w.new_slots.reserve(w.new_slots.size() + 1);
        w.new_slots.push_back(edit.new_slot());
      }
      store_.encode_token(w.bytes(page), row, k.row(t, h), v.row(t, h));
      if (row == pt - 1) w.sealed.push_back(static_cast<std::uint32_t>(page));
    }
    // Only the pages that keep their slot after this call need their bytes in the fast tier:
    // sink, local window, the partial tail, and every page when there is no backing tier.
    const PageRanges after = c_.ranges(w.tokens_after + 1);
    w.pages.finish(
        *w.st, w.tokens_after, w.end_page, [&](std::int64_t p) { return w.slot_of(p); },
        [&](std::int64_t p, bool sealed) { return Core::TierList::kCount == 1 || !sealed || p < after.sink_end || p >= after.local_begin; });
    for (std::uint32_t page : w.sealed) {
      tier::PageKey key = base;
      key.page = page;
      seals.push_back({key, w.bytes(page)});
      store_.append_page_keys(w.bytes(page), w.keys);
    }
  }

  /// The point of no return: the streams take their slots, homes and tokens (cannot fail); then
  /// the index policies' build() and append() run, which must not throw: if one does, the
  /// sequence is marked unusable (release() frees what it holds).
  void commit(typename Core::SequenceT& seq, int layer, SeqId id, std::vector<Head>& heads, const std::vector<SealedPage>& seals,
              PageEdit<typename Core::TierList>& edit) {
    std::size_t at = 0;
    for (Head& w : heads) {
      for (Slot s : w.new_slots) w.st->pages.push_back(PageEntry{s, 0});
      for (std::uint32_t page : w.sealed) edit.set_home(w.st->pages, page, seals[at++].home);
      w.st->pages.tokens = w.tokens_after;
      w.pages.commit(*w.st);
    }
    edit.apply();
    std::size_t h = 0;
    try {
      for (; h < heads.size(); ++h) {
        Head& w = heads[h];
        if (!w.sealed.empty()) c_.index_pages(*w.st, c_.page_keys_view(w.sealed.front(), static_cast<std::int64_t>(w.sealed.size()), w.keys));
        c_.slide_local_window(*w.st, [&](Slot s) { store_.cool(s); });
      }
    } catch (const std::exception& e) {
      seq.broken = true;
      fail("prefill: the index threw while committing layer {} head {} ({}); sequence {} is now unusable: release it", layer, h, e.what(), id);
    }
  }

  Core& c_;
  Store& store_;
};

}  // namespace kvdrive::manager
