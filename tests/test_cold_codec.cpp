// KvManager with a cold codec (Config::cold_codec, docs/codecs.md):
//   - what is attended: sink, local and tail pages in the KV dtype, every cold page (a candidate)
//     as the codec's decoded values, checked against a double-precision reference that codes
//     the pages itself with codec::encode_page/decode_page;
//   - Decision 2 with a codec: the output is the same bits whatever the eviction policy, window,
//     tiers (a fast tier alone, DRAM and SSD behind it, a middle tier), pipeline, thread count,
//     warm-up, and a device fast tier (emulated);
//   - the backing tiers hold coded pages: bytes written and read are coded bytes, nothing is
//     attended in place in host memory, and a damaged coded page on the SSD is an error, not data.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "device_emulation.hpp"
#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/ssd.hpp"
#include "fault_tier.hpp"
#include "support.hpp"
#include "workload.hpp"

using namespace kvdrive;
using namespace kvdrive::test;

namespace {

using Slow = tier::FaultTier<tier::HostTier>;  // not addressable: read through fetches
using FastOnly = Tiers<tier::HostTier>;
using HostSlow = Tiers<tier::HostTier, Slow>;

Workload codec_workload(codec::Codec c, DType dtype) {
  Workload w;
  w.cfg.shape = {2, 8, 2, 64};
  w.cfg.page_tokens = 8;
  w.cfg.sink_tokens = 4;
  w.cfg.local_tokens = 16;
  w.cfg.dtype = dtype;
  w.cfg.budget = Budget::fraction(0.25);
  w.cfg.cold_codec = {c};
  w.prompt = {150, 61, 97};
  w.steps = 10;  // seals pages while decoding, and slides the local window past them
  return w;
}

/// Every output of the workload, prefill then each step and layer.
template <class M>
std::vector<float> outputs(M& kv, const Workload& w) {
  const auto ids = prefill(kv, w);
  std::vector<float> all;
  for (int s = 0; s < w.steps; ++s)
    for (int l = 0; l < w.cfg.shape.layers; ++l) {
      const auto o = step(kv, w, ids, l, s);
      all.insert(all.end(), o.begin(), o.end());
    }
  return all;
}

/// The K (salt 1) or V (salt 2) row of token t of sequence s, layer l, head h, as the workload
/// gives it (prefill rows for the prompt, one row per step after), rounded to the KV dtype.
std::vector<float> token_row(const Workload& w, int s, int l, int t, int h, int salt) {
  const auto& sh = w.cfg.shape;
  const int d = sh.head_dim;
  std::vector<float> r;
  if (t < w.prompt[s]) {
    const auto all = w.rows(s, l, 0, w.prompt[s], sh.kv_heads, salt);
    r.assign(all.begin() + (static_cast<std::ptrdiff_t>(t) * sh.kv_heads + h) * d,
             all.begin() + (static_cast<std::ptrdiff_t>(t) * sh.kv_heads + h + 1) * d);
  } else {
    const auto one = w.rows(s, l, t, 1, sh.kv_heads, salt);
    r.assign(one.begin() + static_cast<std::ptrdiff_t>(h) * d, one.begin() + static_cast<std::ptrdiff_t>(h + 1) * d);
  }
  for (float& x : r) x = dispatch_dtype(w.cfg.dtype, [&](auto tag) { return to_float(from_float<typename decltype(tag)::type>(x)); });
  return r;
}

/// Page p's K and V rows [tokens][d] after the codec's round trip: the page built in the KV
/// dtype, coded and decoded with the codec's own functions.
void coded_page(const Workload& w, int s, int l, int h, int p, std::vector<float>& k, std::vector<float>& v) {
  const int pt = w.cfg.page_tokens, d = w.cfg.shape.head_dim;
  const codec::CodedLayout layout = codec::CodedLayout::make(pt, d, w.cfg.cold_codec);
  dispatch_dtype(w.cfg.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<T> page(2 * static_cast<std::size_t>(pt) * d), back(page.size());
    for (int t = 0; t < pt; ++t) {
      const auto kr = token_row(w, s, l, p * pt + t, h, 1), vr = token_row(w, s, l, p * pt + t, h, 2);
      for (int j = 0; j < d; ++j) {
        page[static_cast<std::size_t>(t) * d + j] = from_float<T>(kr[j]);
        page[(static_cast<std::size_t>(pt) + t) * d + j] = from_float<T>(vr[j]);
      }
    }
    std::vector<std::uint8_t> bytes(layout.bytes);
    codec::encode_page(layout, page.data(), bytes.data());
    codec::decode_page_portable(layout, bytes.data(), back.data());
    k.resize(static_cast<std::size_t>(pt) * d);
    v.resize(k.size());
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = to_float(back[i]), v[i] = to_float(back[k.size() + i]);
  });
}

}  // namespace

TEST_CASE("cold codec: sink, local and tail pages are attended in the KV dtype, cold pages as the codec's decoded values") {
  for (auto [c, dtype] : {std::pair{codec::Codec::int4, DType::f16}, std::pair{codec::Codec::int8, DType::f32}}) {
    CAPTURE(codec::codec_name(c));
    Workload w = codec_workload(c, dtype);
    w.cfg.budget = Budget::fraction(1.0);  // every candidate is attended: every cold page counts
    w.prompt = {75};
    w.steps = 12;
    KvManager<index::Quest, eviction::Lru, HostSlow> kv(w.cfg);
    const auto ids = prefill(kv, w);
    const auto& sh = w.cfg.shape;
    const int d = sh.head_dim, g = w.cfg.group(), pt = w.cfg.page_tokens;
    double worst_coded = 0, worst_exact = 0;
    for (int s = 0; s < w.steps; ++s)
      for (int l = 0; l < sh.layers; ++l) {
        const auto out = step(kv, w, ids, l, s);
        const int t_new = w.prompt[0] + s, tokens = t_new + 1;
        const PageRanges r = page_ranges(tokens, pt, w.cfg.sink_tokens, w.cfg.local_tokens);
        const auto q = w.rows(0, l, t_new, 1, sh.q_heads, 3);
        for (int h = 0; h < sh.kv_heads; ++h) {
          // The rows attention should see: exact, except cold pages' rows, which are decoded.
          std::vector<std::vector<float>> kc(static_cast<std::size_t>(tokens)), vc(kc.size()), ke(kc.size()), ve(kc.size());
          for (int t = 0; t < tokens; ++t) ke[t] = token_row(w, 0, l, t, h, 1), ve[t] = token_row(w, 0, l, t, h, 2);
          kc = ke, vc = ve;
          for (std::int64_t p = r.sink_end; p < r.local_begin; ++p) {
            std::vector<float> pk, pv;
            coded_page(w, 0, l, h, static_cast<int>(p), pk, pv);
            for (int t = 0; t < pt; ++t) {
              const auto row = static_cast<std::size_t>(p * pt + t);
              kc[row].assign(pk.begin() + t * d, pk.begin() + (t + 1) * d);
              vc[row].assign(pv.begin() + t * d, pv.begin() + (t + 1) * d);
            }
          }
          std::vector<const float*> kcp, vcp, kep, vep;
          for (int t = 0; t < tokens; ++t)
            kcp.push_back(kc[t].data()), vcp.push_back(vc[t].data()), kep.push_back(ke[t].data()), vep.push_back(ve[t].data());
          for (int j = 0; j < g; ++j) {
            const float* qh = q.data() + static_cast<std::size_t>(h * g + j) * d;
            const auto coded_ref = reference_attention(qh, kcp, vcp, d, w.cfg.scale());
            const auto exact_ref = reference_attention(qh, kep, vep, d, w.cfg.scale());
            for (int i = 0; i < d; ++i) {
              const double got = out[static_cast<std::size_t>(h * g + j) * d + i];
              worst_coded = std::max(worst_coded, std::fabs(got - coded_ref[i]));
              worst_exact = std::max(worst_exact, std::fabs(got - exact_ref[i]));
            }
          }
        }
      }
    // The output is the coded reference's to float rounding, and far from the uncoded one's.
    CHECK(worst_coded < 2e-5);
    CHECK(worst_exact > 100 * worst_coded);
    MESSAGE(codec::codec_name(c), ": largest difference from the coded reference ", worst_coded, ", from the exact one ", worst_exact);
  }
}

TEST_CASE("cold codec: the output is the same bits whatever the eviction policy, window, tiers, pipeline, threads or warm-up") {
  TempDir dir;
  for (auto [c, dtype] : {std::pair{codec::Codec::int4, DType::f16}, std::pair{codec::Codec::int8, DType::bf16}}) {
    CAPTURE(codec::codec_name(c));
    const Workload w = codec_workload(c, dtype);
    std::vector<float> reference;
    {  // a fast tier alone: cold pages are coded and decoded in their slots
      KvManager<index::Quest, eviction::Lru, FastOnly> kv(w.cfg, {}, {}, {}, {}, backend::Cpu({1}));
      reference = outputs(kv, w);
    }
    {
      Workload plain = w;
      plain.cfg.cold_codec = {};
      KvManager<index::Quest, eviction::Lru, FastOnly> kv(plain.cfg);
      CHECK_FALSE(same_bits(outputs(kv, plain), reference));  // the codec is on
    }
    // INT4 runs every arrangement; INT8 (with bf16) a few, to keep the sanitizer runs short.
    const bool full = c == codec::Codec::int4;
    for (int window : full ? std::vector<int>{0, 1, 3} : std::vector<int>{1}) {
      KvManager<index::Quest, eviction::Lookahead, HostSlow> la(w.cfg, {}, eviction::Lookahead{window}, {}, {}, backend::Cpu({3}));
      CHECK(same_bits(outputs(la, w), reference));
      CHECK(la.total_stats().misses > 0);
      KvManager<index::Quest, eviction::Lru, HostSlow> lru(w.cfg, {}, eviction::Lru{window});
      CHECK(same_bits(outputs(lru, w), reference));
    }
    {  // DRAM behind the fast tier: coded pages are fetched and decoded, never attended in place
      KvManager<index::Quest, eviction::Lru, Tiers<tier::HostTier, tier::HostTier>> kv(w.cfg);
      CHECK(same_bits(outputs(kv, w), reference));
      CHECK(kv.total_stats().in_place == 0);
      CHECK(kv.total_stats().misses > 0);
    }
    {  // a capped middle tier and the last tier, with Elastic over micro-batches of one stream
      using Three = Tiers<tier::HostTier, Slow, tier::HostTier>;
      KvManager<index::Quest, eviction::Lookahead, Three, pipeline::Elastic> kv(
          w.cfg, {}, eviction::Lookahead{1}, Three(tier::HostTier{}, Slow(tier::HostTier({10, 64})), tier::HostTier{}), pipeline::Elastic({1}),
          backend::Cpu({2}));
      CHECK(same_bits(outputs(kv, w), reference));
    }
    if (full) {  // warm-up over a middle tier and an SSD store: the prompt's keys read back (decoded), the
                 // middle tier's copies and the SSD's pages packed by cluster (coded bytes, as stored)
      Workload wl = w;
      wl.prompt = {400, 230};  // enough pages for clusters out of page order
      std::vector<float> hierarchical;
      {
        KvManager<index::Hierarchical, eviction::Lru, FastOnly> kv(wl.cfg);
        hierarchical = outputs(kv, wl);
      }
      using Three = Tiers<tier::HostTier, Slow, tier::SsdTier>;
      tier::SsdTier::Params p;
      p.path = dir.file(c == codec::Codec::int4 ? "warm-int4" : "warm-int8");
      KvManager<index::Hierarchical, eviction::Lookahead, Three> kv(wl.cfg, {}, eviction::Lookahead{2},
                                                                    Three(tier::HostTier{}, Slow(tier::HostTier({40, 64})), tier::SsdTier(p)));
      const auto ids = prefill(kv, wl);
      const auto& sh = wl.cfg.shape;
      std::size_t warmed = 0;
      for (std::size_t s = 0; s < ids.size(); ++s)
        for (int l = 0; l < sh.layers; ++l) {
          const int obs = 8;
          const auto q = wl.rows(static_cast<int>(s), l, wl.prompt[s] - obs, obs, sh.q_heads, 3);
          warmed += kv.warm_up(ids[s], l, make_view(q, obs, sh.q_heads, sh.head_dim));
        }
      CHECK(warmed > 0);
      CHECK(kv.total_stats().placed > 0);
      CHECK(kv.total_stats().packed > 0);
      std::vector<float> out;
      for (int s = 0; s < wl.steps; ++s)
        for (int l = 0; l < sh.layers; ++l) {
          const auto o = step(kv, wl, ids, l, s);
          out.insert(out.end(), o.begin(), o.end());
        }
      CHECK(same_bits(out, hierarchical));
    }
    {  // a device fast tier (emulated): decoded on the host, uploaded; alone, its slots are cooled
      KvManager<index::Quest, eviction::Lookahead, Tiers<EmulatedDeviceTier, Slow>, pipeline::Elastic, EmulatedDeviceBackend> device(
          w.cfg, {}, eviction::Lookahead{1}, {}, pipeline::Elastic({1}));
      CHECK(same_bits(outputs(device, w), reference));
      CHECK(device.staging_pages() == 0);
      KvManager<index::Quest, eviction::Lookahead, Tiers<EmulatedDeviceTier>, pipeline::Serial, EmulatedDeviceBackend> alone(w.cfg);
      CHECK(same_bits(outputs(alone, w), reference));
    }
  }
}

TEST_CASE("cold codec: backing tiers hold coded pages; bytes written and read are coded bytes") {
  const Workload w = codec_workload(codec::Codec::int4, DType::f16);
  const std::size_t coded = codec::CodedLayout::make(w.cfg.page_tokens, w.cfg.shape.head_dim, w.cfg.cold_codec).bytes;
  REQUIRE(coded == 16 + 2 * 64 + 2 * 8 + 2 * 8 * 64 / 2);
  KvManager<index::Quest, eviction::Lookahead, HostSlow> kv(w.cfg, {}, eviction::Lookahead{1});
  (void)outputs(kv, w);
  const Stats& t = kv.total_stats();
  const auto streams = static_cast<std::size_t>(w.cfg.shape.layers * w.cfg.shape.kv_heads);
  std::size_t sealed = 0, sealed_decoding = 0;
  for (int len : w.prompt) {
    sealed += static_cast<std::size_t>((len + w.steps) / w.cfg.page_tokens);
    sealed_decoding += static_cast<std::size_t>((len + w.steps) / w.cfg.page_tokens - len / w.cfg.page_tokens);
  }
  CHECK(kv.tiers().get<1>().inner().stored_pages() == sealed * streams);
  REQUIRE(sealed_decoding > 0);
  CHECK(t.bytes_written[1] == sealed_decoding * streams * coded);  // the statistics count decode steps' writes
  REQUIRE(t.misses > 0);
  CHECK(t.bytes_read[1] == t.misses * coded);
}

TEST_CASE("cold codec: a damaged coded page on the SSD is an error naming the page, never attended") {
  TempDir dir;
  Workload w = codec_workload(codec::Codec::int4, DType::f16);
  w.cfg.budget = Budget::fraction(1.0);
  w.prompt = {120};
  using Ssd = Tiers<tier::HostTier, tier::SsdTier>;
  tier::SsdTier::Params p;
  p.path = dir.file("store");
  p.direct_io = false;
  KvManager<index::Quest, eviction::None, Ssd> kv(w.cfg, {}, {}, Ssd(tier::HostTier{}, tier::SsdTier(p)));
  const auto ids = prefill(kv, w);
  // Flip a byte inside page 3's coded bytes (a cold page of layer 0, head 0).
  const tier::SsdTier& ssd = kv.tiers().get<1>();
  const std::uint64_t at = ssd.slot_offset(ssd.slot_of(tier::PageKey{ids[0], 0, 0, 3})) + 100;
  flip_byte(p.path, at);
  CHECK_THROWS_WITH_AS(step(kv, w, ids, 0, 0), doctest::Contains("checksum"), Error);
}
