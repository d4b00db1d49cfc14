// Shape and configuration of a KvManager: the model's attention shape, the page geometry, the
// KV dtype, the always-attended sink and local tokens, and the sparse budget. Everything is
// validated when the config is built (Budget factories) or handed to KvManager (validate()),
// never mid-decode.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvdrive/codec/page_codec.hpp"
#include "kvdrive/core/dtype.hpp"
#include "kvdrive/core/error.hpp"

namespace kvdrive {

/// The attention shape of a model.
struct ModelShape {
  int layers = 0;
  int q_heads = 0;   ///< query heads
  int kv_heads = 0;  ///< KV heads; q_heads / kv_heads query heads share each (GQA)
  int head_dim = 0;

  /// The most layers, or heads, a shape may have: far past any model, and small enough that
  /// sums and products of them in an int cannot overflow.
  static constexpr int kMaxCount = 1 << 16;

  int group() const { return kv_heads > 0 ? q_heads / kv_heads : 0; }

  void validate() const {
    KVD_EXPECT(layers > 0, "ModelShape: layers is {}, expected > 0", layers);
    KVD_EXPECT(q_heads > 0, "ModelShape: q_heads is {}, expected > 0 (zero heads)", q_heads);
    KVD_EXPECT(kv_heads > 0, "ModelShape: kv_heads is {}, expected > 0 (zero heads)", kv_heads);
    KVD_EXPECT(q_heads % kv_heads == 0, "ModelShape: q_heads {} is not a multiple of kv_heads {} (GQA groups must be equal)", q_heads, kv_heads);
    KVD_EXPECT(head_dim > 0 && head_dim <= 1024, "ModelShape: head_dim is {}, expected 1..1024", head_dim);
    KVD_EXPECT(layers <= kMaxCount && q_heads <= kMaxCount, "ModelShape: {} layers and {} query heads, expected at most {} of each", layers, q_heads,
               kMaxCount);
  }
};

/// How many pages the index may select per stream per step: a fraction of the candidate pages
/// (rounded up) or a fixed count; clamped to the candidates either way.
class Budget {
 public:
  /// f in (0, 1]: selects ceil(f x candidates) pages. Throws kvdrive::Error otherwise.
  static Budget fraction(double f) {
    KVD_EXPECT(f > 0.0 && f <= 1.0 && std::isfinite(f), "Budget::fraction: {} is outside (0, 1]", f);
    Budget b;
    b.fraction_ = f;
    return b;
  }
  /// A fixed number of pages (>= 1).
  static Budget pages(std::int64_t n) {
    KVD_EXPECT(n >= 1, "Budget::pages: {} pages, expected >= 1", n);
    Budget b;
    b.pages_ = n;
    return b;
  }

  bool is_fraction() const { return pages_ == 0; }
  double fraction_value() const { return fraction_; }
  std::int64_t pages_value() const { return pages_; }

  /// Pages to select among `candidates`. The tiny epsilon keeps f x n that is an integer in
  /// exact arithmetic (0.1 x 30) from rounding up to the next one.
  std::int64_t pages_for(std::int64_t candidates) const {
    if (candidates <= 0) return 0;
    const std::int64_t want = is_fraction() ? static_cast<std::int64_t>(std::ceil(fraction_ * static_cast<double>(candidates) - 1e-9)) : pages_;
    return want < 1 ? 1 : (want > candidates ? candidates : want);
  }

 private:
  double fraction_ = 0.0625;
  std::int64_t pages_ = 0;
};

/// Focus carry: a candidate page that held at least `mass` of one query head's attention at a
/// stream's previous step stays selected at this one, the heaviest first and at most
/// floor(share x budget) of them; the index chooses the rest of the budget, so a step never
/// selects more pages than the budget. Retrieval and induction heads of real models put most of
/// a step's attention on one token and move to its neighbour at the next step (copying a number
/// digit by digit); a page's mean key dilutes that one token among the page's others, and the
/// index then loses the page mid-answer (docs/indices.md, "Focus carry"). The carried pages come
/// from the stream's own sparse attention, so the output still depends only on the index, the
/// budget and this rule (Decision 2). share 0 turns it off.
struct FocusCarry {
  float mass = 0.05f;   ///< in (0, 1]: a head's attention share that makes a page carried
  float share = 0.25f;  ///< in [0, 1): the budget's share that carried pages may take

  bool enabled() const { return share > 0.0f; }
  /// Carried pages a step with a budget of `budget_pages` may keep.
  std::int64_t pages_for(std::int64_t budget_pages) const {
    return static_cast<std::int64_t>(std::floor(static_cast<double>(share) * static_cast<double>(budget_pages)));
  }
  void validate() const {
    KVD_EXPECT(mass > 0.0f && mass <= 1.0f, "FocusCarry: mass is {}, expected in (0, 1]", mass);
    KVD_EXPECT(share >= 0.0f && share < 1.0f, "FocusCarry: share is {}, expected in [0, 1) (0 turns it off)", share);
  }
};

/// Observation pins (SnapKV's observation window as a selection rule): the candidate pages the
/// prompt's last queries attended most (the warm-up ranking, KvManager::warm_up) stay selected at
/// every decode step, at most floor(share x budget) of them, best first; the index chooses the
/// rest of the budget, beside the focus carry's pages. The question at the prompt's end names the
/// pages the answer needs. The ranking depends only on the prompt, so the output still depends
/// only on the index, the budget and these rules (Decision 2). share 0 turns it off.
struct ObservationPins {
  float share = 0.0f;  ///< in [0, 1): the budget's share that pinned pages may take

  bool enabled() const { return share > 0.0f; }
  /// Pinned pages a step with a budget of `budget_pages` may keep.
  std::int64_t pages_for(std::int64_t budget_pages) const {
    return static_cast<std::int64_t>(std::floor(static_cast<double>(share) * static_cast<double>(budget_pages)));
  }
  void validate() const { KVD_EXPECT(share >= 0.0f && share < 1.0f, "ObservationPins: share is {}, expected in [0, 1) (0 turns it off)", share); }
};

struct Config {
  ModelShape shape;
  int page_tokens = 8;  ///< tokens per page (8 x 128 x fp16: K 2 KiB + V 2 KiB = one 4 KiB block)
  DType dtype = DType::f16;
  int sink_tokens = 4;    ///< first tokens of every stream, always attended and resident
  int local_tokens = 64;  ///< last tokens of every stream, always attended and resident
  Budget budget = Budget::fraction(0.0625);
  float softmax_scale = 0.0f;  ///< 0 means 1/sqrt(head_dim)
  FocusCarry carry;            ///< pages the previous step attended heavily stay selected
  ObservationPins pins;        ///< pages the prompt's last queries attended most stay selected (after warm_up)
  /// Semantic packing: KvManager::warm_up rewrites each stream's prompt pages on the last tier
  /// (when it is not addressable) grouped by the index's cluster_of(page), so pages selected
  /// together sit together and a step's misses merge into fewer, larger reads. Costs one more
  /// write of the prompt; needs an index with clusters (Hierarchical).
  bool pack_by_cluster = true;
  /// Cold pages (sealed, past the sink and the local window: the index's candidates) are kept
  /// on every backing tier in this codec and attended as its decoded values, wherever they are
  /// read from; sink, local and tail pages stay in the KV dtype (docs/codecs.md). none: off.
  codec::PageCodec cold_codec{};

  int group() const { return shape.group(); }
  float scale() const { return softmax_scale > 0.0f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim)); }
  std::size_t elem_bytes() const { return dtype_size(dtype); }
  /// Bytes of one K block (or V block) of a page.
  std::size_t block_bytes() const { return static_cast<std::size_t>(page_tokens) * static_cast<std::size_t>(shape.head_dim) * elem_bytes(); }
  /// Bytes of one page: its K block followed by its V block.
  std::size_t page_bytes() const { return 2 * block_bytes(); }
  /// How a cold page is laid out when coded (a layout of 0 bytes without a cold codec); throws
  /// for a shape the codec cannot code.
  codec::CodedLayout cold_layout() const {
    return cold_codec.coded() ? codec::CodedLayout::make(page_tokens, shape.head_dim, cold_codec) : codec::CodedLayout{};
  }
  /// Bytes of a cold page on the backing tiers: coded with the cold codec, else page_bytes().
  std::size_t stored_page_bytes() const { return cold_codec.coded() ? cold_layout().bytes : page_bytes(); }

  void validate() const {
    shape.validate();
    KVD_EXPECT(page_tokens >= 1 && page_tokens <= 4096, "Config: page_tokens is {}, expected 1..4096", page_tokens);
    KVD_EXPECT(sink_tokens >= 0, "Config: sink_tokens is {}, expected >= 0", sink_tokens);
    KVD_EXPECT(local_tokens >= 0, "Config: local_tokens is {}, expected >= 0", local_tokens);
    KVD_EXPECT(softmax_scale >= 0.0f && std::isfinite(softmax_scale), "Config: softmax_scale is {}, expected >= 0 (0 = 1/sqrt(head_dim))",
               softmax_scale);
    carry.validate();
    pins.validate();
    KVD_EXPECT(carry.share + pins.share < 1.0f, "Config: carry share {} and pins share {} leave the index no budget (their sum must be < 1)",
               carry.share, pins.share);
    (void)cold_layout();  // throws for a shape the cold codec cannot code
  }
};

}  // namespace kvdrive
