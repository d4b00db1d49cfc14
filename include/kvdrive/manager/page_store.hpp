// PageStore: every move of page bytes a KvManager makes, in one unit. Token rows are encoded
// into pages, pages are looked up (for attention, or as host bytes to read their keys), sealed
// pages go to the backing tiers, reads land in staging and fetched pages reach their fast slots.
// Where the fast tier lives decides how, once: PageStore<Core, false> writes and reads host
// slots directly; PageStore<Core, true> (a device fast tier, cuda::DeviceTier) keeps each tail
// page in host memory too, reads misses into pinned host staging pages and uploads them, and
// downloads a slot to read it. The rest of the manager calls the same members either way.
// With a cold codec (Config::cold_codec, docs/codecs.md) the backing tiers hold every page coded
// (stored_bytes() each): store_sealed() codes what it writes, and every read from a backing tier
// decodes into the KV dtype (in land(), read_backed()), so no coded page is attended in place. A
// page that keeps a fast slot as it turns cold (a fast tier alone) is coded and decoded in place
// by cool(), so it is attended as the same values wherever it lives.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvdrive/attention/convert.hpp"
#include "kvdrive/codec/cpu_codec.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/half.hpp"
#include "kvdrive/core/page_ranges.hpp"
#include "kvdrive/core/page_table.hpp"
#include "kvdrive/manager/page_edit.hpp"
#include "kvdrive/tier/concept.hpp"
#include "kvdrive/tier/page_key.hpp"
#include "kvdrive/tier/page_pool.hpp"

namespace kvdrive::manager {

/// A page sealed by prefill or a step, on its way to a backing tier; `home` is set on the way.
struct SealedPage {
  tier::PageKey key;
  const std::byte* bytes = nullptr;
  std::uint8_t home = 0;
};

/// What both kinds of fast tier share: encoding, key decoding, the backing tiers' write path.
template <class Core>
class PageStoreBase {
 public:
  using TierList = typename Core::TierList;
  static constexpr std::size_t kLastTier = Core::kLastTier;

  explicit PageStoreBase(Core& c) : c_(c), layout_(c.cfg.cold_layout()) {}

  /// Bytes of a page in the KV dtype: in the fast tier, and on the remote tier.
  std::size_t page_bytes(const tier::PageKey& = {}) const { return c_.cfg.page_bytes(); }
  /// Bytes of a page on the backing tiers: coded with a cold codec, else page_bytes().
  std::size_t stored_bytes() const { return coded() ? layout_.bytes : page_bytes(); }
  bool coded() const { return layout_.bytes != 0; }

  /// Pages on tier `home` are attended where they are (Decision 7): host memory, with a host
  /// fast tier, and pages in the KV dtype. A device backend attends only its own memory, and a
  /// coded page must be decoded, so those pass through the fast tier.
  bool attends_in_place(std::size_t home) const { return !Core::kDeviceFast && TierList::addressable(home) && !coded(); }

  /// Codes a page (page_bytes()) into `out` (stored_bytes()).
  void encode(const std::byte* page, std::byte* out) const {
    dispatch_dtype(c_.cfg.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      codec::encode_page(layout_, reinterpret_cast<const T*>(page), reinterpret_cast<std::uint8_t*>(out));
    });
  }
  /// Decodes a coded page into `page` (page_bytes()).
  void decode(const std::byte* coded_page, std::byte* page) const {
    dispatch_dtype(c_.cfg.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      codec::decode_page(layout_, reinterpret_cast<const std::uint8_t*>(coded_page), reinterpret_cast<T*>(page));
    });
  }
  /// A page turning cold, in host memory: replaced by its decoded values (decode(encode(page))),
  /// the values every tier gives for it from now on.
  void cool_host(std::byte* page) const {
    thread_local std::vector<std::byte> coded_page;
    coded_page.resize(layout_.bytes);
    encode(page, coded_page.data());
    decode(coded_page.data(), page);
  }

  /// Stores row `row` of a page: K at row*d in the K block, V in the V block, in the KV dtype.
  void encode_token(std::byte* page, int row, const float* k, const float* v) const {
    const int d = c_.cfg.shape.head_dim;
    dispatch_dtype(c_.cfg.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* kb = reinterpret_cast<T*>(page) + static_cast<std::size_t>(row) * d;
      T* vb = reinterpret_cast<T*>(page + c_.cfg.block_bytes()) + static_cast<std::size_t>(row) * d;
      for (int j = 0; j < d; ++j) {
        kb[j] = from_float<T>(k[j]);
        vb[j] = from_float<T>(v[j]);
      }
    });
  }

  /// The first n values of a block (a page's K block, or its V block at block_bytes()) as float.
  void decode_block(const std::byte* block, float* out, std::size_t n) const {
    dispatch_dtype(c_.cfg.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      attention::to_float_block(reinterpret_cast<const T*>(block), out, n);
    });
  }

  /// Appends the keys of a page (its bytes in host memory) to `keys`, as float, for the index.
  void append_page_keys(const std::byte* bytes, std::vector<float>& keys) const {
    const std::size_t rows = static_cast<std::size_t>(c_.cfg.page_tokens) * c_.cfg.shape.head_dim;
    const std::size_t at = keys.size();
    keys.resize(at + rows);
    decode_block(bytes, keys.data() + at, rows);
  }

  /// The page's address where it lives on an addressable tier, or null.
  const std::byte* in_place_address(std::size_t home, const tier::PageKey& key) {
    const std::byte* addr = nullptr;
    c_.tiers.visit(home, [&](auto& t) {
      if constexpr (tier::AddressableTier<std::remove_cvref_t<decltype(t)>>) addr = t.address(key);
    });
    return addr;
  }

  /// The page's stored bytes (coded with a cold codec) from its backing tier: in place where
  /// addressable, else read into dst (stored_bytes()).
  const std::byte* read_stored(std::size_t home, const tier::PageKey& key, std::byte* dst) {
    const std::byte* addr = nullptr;
    c_.tiers.visit(home, [&](auto& t) {
      if constexpr (tier::AddressableTier<std::remove_cvref_t<decltype(t)>>) {
        addr = t.address(key);
      } else {
        const tier::ReadRequest read{key, dst};
        t.wait(t.submit(std::span<const tier::ReadRequest>(&read, 1)));
        addr = dst;
      }
    });
    KVD_EXPECT(addr != nullptr, "page {} has no bytes on tier {}", key, home);
    return addr;
  }

  /// The page in the KV dtype from its backing tier: its stored bytes, decoded into dst
  /// (page_bytes()) when coded.
  const std::byte* read_backed(std::size_t home, const tier::PageKey& key, std::byte* dst) {
    if (!coded()) return read_stored(home, key, dst);
    thread_local std::vector<std::byte> stored;
    stored.resize(layout_.bytes);
    decode(read_stored(home, key, stored.data()), dst);
    return dst;
  }

  /// Writes one batch of pages to backing tier `i`, in one write_batch() where the tier has one
  /// (SsdTier syncs once per batch), recording each page in the edit as soon as it is stored.
  void write_pages(std::size_t i, std::span<const tier::WriteRequest> reqs, PageEdit<TierList>& edit) {
    if (reqs.empty()) return;
    const auto home = static_cast<std::uint8_t>(i);
    std::vector<WrittenPage>& written = edit.written();
    written.reserve(written.size() + reqs.size());  // recording them after the write must not fail
    c_.tiers.visit(i, [&](auto& t) {
      if constexpr (requires { t.write_batch(reqs); }) {
        t.write_batch(reqs);
        for (const tier::WriteRequest& r : reqs) written.push_back({home, r.key});
      } else {
        for (const tier::WriteRequest& r : reqs) {
          t.write(r.key, r.src);
          written.push_back({home, r.key});
        }
      }
    });
  }

  /// Writes sealed pages to the backing tiers and sets each page's home, the nearest tier that
  /// holds it (0 when there is no backing tier: the page stays in the fast tier). The last tier
  /// keeps every page. With `copy_to_middle` (pages sealed while decoding), a copy also goes to
  /// the first middle tier with room; prompt pages reach the middle tiers through placement
  /// (warm_up), by importance. Records each page written in the edit.
  void store_sealed(std::span<SealedPage> pages, PageEdit<TierList>& edit, bool copy_to_middle) {
    if constexpr (TierList::kCount == 1) {
      for (SealedPage& p : pages) p.home = 0;
    } else {
      if (pages.empty()) return;
      std::vector<tier::WriteRequest> reqs;
      std::vector<std::byte> coded_pages(coded() ? pages.size() * layout_.bytes : 0);
      for (std::size_t i = 0; i < pages.size(); ++i) {
        const std::byte* src = pages[i].bytes;
        if (coded()) {
          encode(src, coded_pages.data() + i * layout_.bytes);
          src = coded_pages.data() + i * layout_.bytes;
        }
        reqs.push_back({pages[i].key, src});
      }
      const std::size_t room = free_pages(kLastTier);
      if (room < pages.size())
        fail("backing tier {} (tier {}, the last, which keeps every page) is full: cannot store page {}",
             c_.tiers.visit(kLastTier, [](auto& t) { return std::string(t.name()); }), kLastTier, pages[room].key);
      write_pages(kLastTier, reqs, edit);
      for (SealedPage& p : pages) p.home = static_cast<std::uint8_t>(kLastTier);
      if (!copy_to_middle) return;
      std::size_t next = 0;
      for (std::size_t i = 1; i < kLastTier && next < pages.size(); ++i) {
        const std::size_t n = std::min(pages.size() - next, free_pages(i));
        write_pages(i, std::span<const tier::WriteRequest>(reqs).subspan(next, n), edit);
        for (std::size_t j = next; j < next + n; ++j) pages[j].home = static_cast<std::uint8_t>(i);
        next += n;
      }
    }
  }

  /// Forgets a backed page on every tier that holds it: its home and the last tier.
  void erase_backed(std::uint8_t home, const tier::PageKey& key) {
    if (home == 0) return;
    c_.tiers.visit(home, [&](auto& t) { t.erase(key); });
    if (home != kLastTier) c_.tiers.visit(kLastTier, [&](auto& t) { t.erase(key); });
  }

  std::size_t free_pages(std::size_t i) {
    return c_.tiers.visit(i, [](auto& t) -> std::size_t { return t.free_pages(); });
  }

 protected:
  /// Registers fast memory with every backing tier that reads into registered memory (SsdTier:
  /// io_uring fixed buffers, Decision 9). A tier that cannot register just reads as before.
  void register_with_backing(std::byte* p, std::size_t bytes) {
    for (std::size_t i = 1; i < TierList::kCount; ++i)
      c_.tiers.visit(i, [&](auto& t) {
        if constexpr (requires { t.register_memory(p, bytes); }) (void)t.register_memory(p, bytes);
      });
  }

  Core& c_;
  codec::CodedLayout layout_{};  ///< the cold codec's layout (bytes 0: none)
};

template <class Core, bool Device = Core::kDeviceFast>
class PageStore;

/// A fast tier in host memory: slots are written, read and attended where they are.
template <class Core>
class PageStore<Core, false> : public PageStoreBase<Core> {
  using Base = PageStoreBase<Core>;
  using Base::c_;

 public:
  using StreamT = typename Core::StreamT;
  using Base::Base;

  /// The fast tier's memory is where fetched pages land: each new block of it is registered
  /// with the backing tiers that read into registered memory.
  void register_fast_memory() {
    if constexpr (requires(typename Core::Fast & f, tier::PagePool::BlockHook h) { f.add_block_hook(h); })
      c_.tiers.fast().add_block_hook([this](std::byte* p, std::size_t bytes) { this->register_with_backing(p, bytes); });
  }

  /// Where the backend attends a fast slot.
  const std::byte* slot_address(Slot s) { return c_.tiers.fast().slot_data(s); }

  /// A page's bytes in host memory: its fast slot, its address on an addressable tier, or read
  /// into `scratch` from its tier.
  const std::byte* host_bytes(const PageEntry& e, const tier::PageKey& key, std::byte* scratch) {
    if (e.slot >= 0) return c_.tiers.fast().slot_data(e.slot);
    return this->read_backed(e.home, key, scratch);
  }

  /// Writes the new token into row `row` of the tail page (slot `tail`).
  void write_token(StreamT&, Slot tail, int row, const float* k, const float* v) { this->encode_token(c_.tiers.fast().slot_data(tail), row, k, v); }
  /// A page keeping its fast slot as it turns cold takes its decoded values (cold codec only).
  void cool(Slot s) {
    if (this->coded()) this->cool_host(c_.tiers.fast().slot_data(s));
  }
  /// The bytes of a stream's tail page (in slot `tail`), in host memory.
  const std::byte* tail_bytes(const StreamT&, Slot tail) { return c_.tiers.fast().slot_data(tail); }

  /// Reads that land in fast slots: with host slots they land in place; coded pages land in
  /// buffers of their own and land() decodes them into their slots.
  struct Staging {
    std::vector<std::pair<Slot, std::vector<std::byte>>> coded;  ///< (fast slot, the page as read)
    void drop() { coded.clear(); }
  };
  std::byte* stage(Staging& s, Slot slot) {
    if (!this->coded()) return c_.tiers.fast().slot_data(slot);
    s.coded.emplace_back(slot, std::vector<std::byte>(this->stored_bytes()));
    return s.coded.back().second.data();
  }
  void land(std::span<Staging* const> staged) {
    for (Staging* s : staged) {
      for (const auto& [slot, bytes] : s->coded) this->decode(bytes.data(), c_.tiers.fast().slot_data(slot));
      s->drop();
    }
  }

  /// Where prefill writes a stream's pages [first_page, end_page): straight into their slots.
  class PrefillPages {
   public:
    PrefillPages(PageStore& s, const StreamT&, std::int64_t, std::int64_t) : s_(&s) {}
    std::byte* page(std::int64_t, Slot slot) { return s_->c_.tiers.fast().slot_data(slot); }
    template <class SlotOf, class Keeps>
    void finish(const StreamT&, std::int64_t, std::int64_t, SlotOf&&, Keeps&&) {}
    void commit(StreamT&) noexcept {}

   private:
    PageStore* s_;
  };
};

/// A fast tier in device memory: the host never dereferences a slot.
template <class Core>
class PageStore<Core, true> : public PageStoreBase<Core> {
  using Base = PageStoreBase<Core>;
  using Base::c_;

 public:
  using StreamT = typename Core::StreamT;
  using Base::Base;

  /// Reads land in the host staging pool, which the fast tier pins (cudaHostRegister) so that
  /// uploads from it are asynchronous DMA; it is registered with the backing tiers too.
  void register_fast_memory() {
    c_.bounce.open(this->page_bytes(), 4096, 0, [this](std::byte* p, std::size_t bytes) {
      this->register_with_backing(p, bytes);
      c_.tiers.fast().pin_host(p, bytes);  // last: it does not fail, so a pinned block is never freed by the pool
    });
  }

  const std::byte* slot_address(Slot s) { return c_.tiers.fast().slot_data(s); }

  const std::byte* host_bytes(const PageEntry& e, const tier::PageKey& key, std::byte* scratch) {
    if (e.slot >= 0) {
      c_.tiers.fast().download(e.slot, scratch);
      return scratch;
    }
    return this->read_backed(e.home, key, scratch);
  }

  /// A page keeping its fast slot as it turns cold takes its decoded values (cold codec only):
  /// down, coded and decoded on the host, and up again.
  void cool(Slot s) {
    if (!this->coded()) return;
    thread_local std::vector<std::byte> page;
    page.resize(this->page_bytes());
    c_.tiers.fast().download(s, page.data());
    this->cool_host(page.data());
    c_.tiers.fast().upload(s, 0, page.data(), this->page_bytes());
  }

  /// New tokens are written into the host copy of the tail page, then the page goes up.
  void write_token(StreamT& st, Slot tail, int row, const float* k, const float* v) {
    st.tail_host.resize(this->page_bytes());
    this->encode_token(st.tail_host.data(), row, k, v);
    c_.tiers.fast().upload(tail, 0, st.tail_host.data(), this->page_bytes());
  }
  const std::byte* tail_bytes(const StreamT& st, Slot) { return st.tail_host.data(); }

  /// Staging pages that reads land in, each bound for a fast slot; freed by land() or drop().
  class Staging {
   public:
    Staging() = default;
    Staging(Staging&& o) noexcept : pool_(o.pool_), pages_(std::move(o.pages_)) { o.pages_.clear(); }
    Staging& operator=(Staging&&) = delete;
    ~Staging() { drop(); }
    void drop() {
      for (const auto& [slot, page] : pages_) pool_->release(page);
      pages_.clear();
    }

   private:
    friend class PageStore;
    tier::PagePool* pool_ = nullptr;
    std::vector<std::pair<Slot, Slot>> pages_;  ///< (fast slot, staging page)
  };
  std::byte* stage(Staging& s, Slot slot) {
    s.pool_ = &c_.bounce;
    s.pages_.reserve(s.pages_.size() + 1);
    const Slot page = c_.bounce.allocate();
    s.pages_.emplace_back(slot, page);
    return c_.bounce.data(page);
  }
  /// Uploads the staged pages to their slots, in one batch, and frees the staging pages. Coded
  /// pages are decoded on the host first, each into a staging page of its own.
  void land(std::span<Staging* const> staged) {
    std::vector<tier::SlotUpload> up;
    for (Staging* s : staged) {
      const std::size_t read = s->pages_.size();
      for (std::size_t i = 0; i < read; ++i) {
        const auto [slot, page] = s->pages_[i];
        if (!this->coded()) {
          up.push_back({slot, c_.bounce.data(page)});
          continue;
        }
        s->pages_.reserve(s->pages_.size() + 1);
        const Slot decoded = c_.bounce.allocate();
        s->pages_.emplace_back(-1, decoded);  // freed with the others
        this->decode(c_.bounce.data(page), c_.bounce.data(decoded));
        up.push_back({slot, c_.bounce.data(decoded)});
      }
    }
    c_.tiers.fast().upload_pages(up);
    for (Staging* s : staged) s->drop();
  }

  /// Where prefill writes a stream's pages [first_page, end_page): host memory, starting from
  /// the tail page's bytes; finish() uploads the pages that keep their slot.
  class PrefillPages {
   public:
    PrefillPages(PageStore& s, const StreamT& st, std::int64_t first_page, std::int64_t end_page)
        : s_(&s), first_(first_page), host_(static_cast<std::size_t>(end_page - first_page) * s.page_bytes(), std::byte{0}) {
      if (st.pages.tokens % s.c_.cfg.page_tokens != 0) std::copy(st.tail_host.begin(), st.tail_host.end(), host_.begin());
    }
    std::byte* page(std::int64_t page, Slot) { return host_.data() + static_cast<std::size_t>(page - first_) * s_->page_bytes(); }

    /// Only the pages that keep their slot after this call go up (keeps(page, sealed)); the
    /// others leave the fast tier at commit and live on their backing tier from the start.
    template <class SlotOf, class Keeps>
    void finish(const StreamT&, std::int64_t tokens_after, std::int64_t end_page, SlotOf&& slot_of, Keeps&& keeps) {
      const std::int64_t pt = s_->c_.cfg.page_tokens;
      std::vector<tier::SlotUpload> up;
      for (std::int64_t p = first_; p < end_page; ++p)
        if (keeps(p, (p + 1) * pt <= tokens_after)) up.push_back({slot_of(p), page(p, -1)});
      s_->c_.tiers.fast().upload_pages(up);
      if (tokens_after % pt != 0) tail_.assign(page(end_page - 1, -1), page(end_page - 1, -1) + s_->page_bytes());
    }
    void commit(StreamT& st) noexcept { st.tail_host.swap(tail_); }

   private:
    PageStore* s_;
    std::int64_t first_;
    std::vector<std::byte> host_, tail_;
  };
};

}  // namespace kvdrive::manager
