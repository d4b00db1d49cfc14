// PageTable: where each page of one stream lives. A page is resident when it holds a slot of the
// fast tier (sink, local and tail pages, cached pages); its home is the nearest backing tier that
// holds it (the last backing tier holds every page; 0:
// only the fast tier, when there is no backing tier). Pages are indexed from 0; the last entry is
// the tail page while tokens is not a multiple of the page size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvdrive {

/// A slot of a tier's page pool; -1 means none.
using Slot = std::int32_t;

struct PageEntry {
  Slot slot = -1;         ///< fast-tier slot holding the page, or -1
  std::uint8_t home = 0;  ///< index in Tiers<...> of the nearest backing tier holding the page
                          ///< (the last one always does); 0 = fast tier only

  bool resident() const { return slot >= 0; }
};

class PageTable {
 public:
  std::int64_t tokens = 0;          ///< tokens stored (prefill and decoded)
  std::int64_t released_below = 0;  ///< pages below this have left the local window

  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  PageEntry& operator[](std::size_t page) { return entries_[page]; }
  const PageEntry& operator[](std::size_t page) const { return entries_[page]; }
  PageEntry& back() { return entries_.back(); }
  void push_back(PageEntry e) { entries_.push_back(e); }

  /// Pages holding page_tokens tokens each (the tail page, if partial, is not sealed).
  std::int64_t sealed_pages(int page_tokens) const { return tokens / page_tokens; }

 private:
  std::vector<PageEntry> entries_;
};

}  // namespace kvdrive
