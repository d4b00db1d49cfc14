// PageEdit: what one manager call has done to the tiers before its point of no return, so that a
// failure can take it all back (Decision 8): the fresh fast slots it holds, and the pages it
// stored on backing tiers. Calls build one, do their fallible work through it, then either
// keep() it (the streams now own its slots and pages) or let it undo(): its destructor undoes an
// edit that was not kept, so an exception anywhere before keep() leaves the tiers as they were.
// Homes that pages take when the edit applies are recorded too, and set by apply().
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvdrive/core/page_table.hpp"
#include "kvdrive/tier/page_key.hpp"

namespace kvdrive::manager {

/// A page stored on backing tier `home` under `key`.
struct WrittenPage {
  std::uint8_t home = 0;
  tier::PageKey key;
};

template <class TierList>
class PageEdit {
 public:
  explicit PageEdit(TierList& tiers) : tiers_(tiers) {}
  PageEdit(const PageEdit&) = delete;
  PageEdit& operator=(const PageEdit&) = delete;
  ~PageEdit() { undo(); }

  /// A fresh fast slot that the edit holds until keep().
  Slot new_slot() {
    slots_.reserve(slots_.size() + 1);  // recording it must not fail once it is allocated
    const Slot s = tiers_.fast().allocate();
    slots_.push_back(s);
    return s;
  }

  /// The pages stored so far; write paths reserve before they write, then record.
  std::vector<WrittenPage>& written() { return written_; }

  /// Page `page` of `table` takes home `home` at apply().
  void set_home(PageTable& table, std::uint32_t page, std::uint8_t home) { homes_.push_back({&table, page, home}); }
  std::size_t homes() const { return homes_.size(); }

  /// Sets the recorded homes and keeps the edit. Cannot fail.
  void apply() noexcept {
    for (const Home& h : homes_) (*h.table)[h.page].home = h.home;
    keep();
  }
  /// The point of no return: the slots and pages now belong to the streams.
  void keep() noexcept {
    slots_.clear();
    written_.clear();
    homes_.clear();
  }

  /// Frees the held slots and erases the stored pages (best effort: an erase that fails leaves a
  /// page nobody points at, which is harmless).
  void undo() noexcept {
    for (Slot s : slots_) tiers_.fast().release(s);
    for (const WrittenPage& w : written_) try {
        tiers_.visit(w.home, [&](auto& t) { t.erase(w.key); });
      } catch (...) {
      }
    keep();
  }

 private:
  struct Home {
    PageTable* table;
    std::uint32_t page;
    std::uint8_t home;
  };
  TierList& tiers_;
  std::vector<Slot> slots_;
  std::vector<WrittenPage> written_;
  std::vector<Home> homes_;
};

}  // namespace kvdrive::manager
