// KvManager end to end on the CPU: dense exactness, exactly-once attendance, the cache path,
// bitwise determinism across threads, tiers and eviction, commit-or-nothing, and bad input.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <random>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "fault_tier.hpp"
#include "support.hpp"

using namespace kvdrive;

namespace {

using FaultyTiers = Tiers<tier::HostTier, tier::FaultTier<tier::HostTier>>;

/// A seeded decode workload: sequences of different prompt lengths, then decode steps; every
/// token's K/V is kept in float (rounded to the KV dtype) for reference computations.
struct Workload {
  Config cfg;
  std::vector<int> prompt;  // prompt length per sequence
  int steps = 4;
  std::uint64_t seed = 1;
  bool zero_queries = false;
  bool index_values = false;  // V_t[0] = t^2, V_t[1] = t: the output reveals who was attended

  // k/v for sequence s, layer l, token t: deterministic from the seed.
  std::vector<float> row(std::uint64_t tag, int s, int l, std::int64_t t, int heads) const {
    auto r = test::random_floats(static_cast<std::size_t>(heads) * cfg.shape.head_dim,
                                 seed * 1000003 + tag * 7919 + static_cast<std::uint64_t>(s) * 104729 + static_cast<std::uint64_t>(l) * 1299709 +
                                     static_cast<std::uint64_t>(t) * 15485863);
    return r;
  }
  std::vector<float> key(int s, int l, std::int64_t t) const { return row(1, s, l, t, cfg.shape.kv_heads); }
  std::vector<float> value(int s, int l, std::int64_t t) const {
    auto v = row(2, s, l, t, cfg.shape.kv_heads);
    if (index_values)
      for (int h = 0; h < cfg.shape.kv_heads; ++h) {
        v[static_cast<std::size_t>(h) * cfg.shape.head_dim] = static_cast<float>(t * t);
        v[static_cast<std::size_t>(h) * cfg.shape.head_dim + 1] = static_cast<float>(t);
      }
    return v;
  }
  std::vector<float> query(int s, int l, std::int64_t t) const {
    auto q = row(3, s, l, t, cfg.shape.q_heads);
    if (zero_queries) std::fill(q.begin(), q.end(), 0.0f);
    return q;
  }
};

/// One attend() of `layer` for every sequence of the workload at decode step `step`; returns
/// the outputs [sequences][q_heads][head_dim].
template <class Manager>
std::vector<float> decode_step(Manager& kv, const Workload& w, std::span<const SeqId> ids, int layer, int step) {
  const auto& sh = w.cfg.shape;
  const int d = sh.head_dim, b = static_cast<int>(ids.size());
  std::vector<float> q, k, v, out(static_cast<std::size_t>(b) * sh.q_heads * d);
  for (int s = 0; s < b; ++s) {
    const std::int64_t t = w.prompt[s] + step;
    auto qr = w.query(s, layer, t), kr = w.key(s, layer, t), vr = w.value(s, layer, t);
    q.insert(q.end(), qr.begin(), qr.end());
    k.insert(k.end(), kr.begin(), kr.end());
    v.insert(v.end(), vr.begin(), vr.end());
  }
  kv.attend(layer, ids, make_view(q, b, sh.q_heads, d), make_view(k, b, sh.kv_heads, d), make_view(v, b, sh.kv_heads, d),
            make_view(out, b, sh.q_heads, d));
  return out;
}

/// Runs the workload; returns every output of every step, layer and sequence, in order.
template <class Manager>
std::vector<float> run(Manager& kv, const Workload& w) {
  const auto& sh = w.cfg.shape;
  const int d = sh.head_dim, b = static_cast<int>(w.prompt.size());
  std::vector<SeqId> ids;
  for (int s = 0; s < b; ++s) {
    ids.push_back(kv.add_sequence());
    for (int l = 0; l < sh.layers; ++l) {
      std::vector<float> k, v;
      for (int t = 0; t < w.prompt[s]; ++t) {
        auto kr = w.key(s, l, t), vr = w.value(s, l, t);
        k.insert(k.end(), kr.begin(), kr.end());
        v.insert(v.end(), vr.begin(), vr.end());
      }
      kv.prefill(ids.back(), l, make_view(k, w.prompt[s], sh.kv_heads, d), make_view(v, w.prompt[s], sh.kv_heads, d));
    }
  }
  std::vector<float> all;
  for (int step = 0; step < w.steps; ++step)
    for (int l = 0; l < sh.layers; ++l) {
      const auto out = decode_step(kv, w, ids, l, step);
      all.insert(all.end(), out.begin(), out.end());
    }
  return all;
}

float round_to(DType t, float x) {
  return dispatch_dtype(t, [&](auto tag) { return to_float(from_float<typename decltype(tag)::type>(x)); });
}

Config small_config(DType dtype = DType::f32) {
  Config c;
  c.shape = {2, 8, 2, 64};
  c.page_tokens = 4;
  c.dtype = dtype;
  c.sink_tokens = 4;
  c.local_tokens = 16;
  c.budget = Budget::fraction(0.25);
  return c;
}

}  // namespace

TEST_CASE("Dense KvManager computes full attention") {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    Workload w;
    w.cfg = small_config(dtype);
    w.cfg.page_tokens = 5;
    w.prompt = {37, 3, 64};  // different lengths, not page multiples, one shorter than sink+local
    w.steps = 6;
    KvManager<index::Dense, eviction::Lru> kv(w.cfg);
    const auto out = run(kv, w);

    // Reference: every token so far, in double, with K/V rounded to the dtype.
    const auto& sh = w.cfg.shape;
    const int d = sh.head_dim, g = sh.group();
    std::size_t at = 0;
    double worst = 0;
    for (int step = 0; step < w.steps; ++step)
      for (int l = 0; l < sh.layers; ++l)
        for (int s = 0; s < static_cast<int>(w.prompt.size()); ++s) {
          const std::int64_t n = w.prompt[s] + step + 1;
          std::vector<std::vector<float>> ks, vs;
          for (std::int64_t t = 0; t < n; ++t) {
            auto kr = w.key(s, l, t), vr = w.value(s, l, t);
            for (auto& x : kr) x = round_to(dtype, x);
            for (auto& x : vr) x = round_to(dtype, x);
            ks.push_back(kr);
            vs.push_back(vr);
          }
          const auto q = w.query(s, l, n - 1);
          for (int qh = 0; qh < sh.q_heads; ++qh) {
            const int kvh = qh / g;
            std::vector<const float*> kp, vp;
            for (std::int64_t t = 0; t < n; ++t) {
              kp.push_back(ks[t].data() + static_cast<std::size_t>(kvh) * d);
              vp.push_back(vs[t].data() + static_cast<std::size_t>(kvh) * d);
            }
            const auto ref = test::reference_attention(q.data() + static_cast<std::size_t>(qh) * d, kp, vp, d, w.cfg.scale());
            for (int j = 0; j < d; ++j) worst = std::max(worst, std::fabs(ref[j] - out[at + static_cast<std::size_t>(qh) * d + j]));
          }
          at += static_cast<std::size_t>(sh.q_heads) * d;
        }
    CHECK(at == out.size());
    CHECK(worst < 2e-5);
    CHECK(kv.last_stats().selected == kv.last_stats().candidates);
  }
}

TEST_CASE("every token is attended exactly once: sink, candidates, local and tail") {
  // With zero queries every score is 0, so a token's weight is 1/(tokens attended): the output's
  // V_t[1] average and the count reveal who was attended, and how often.
  for (int pt : {1, 3, 4, 8})
    for (int local : {0, 5, 16})
      for (int sink : {0, 4, 9}) {
        Workload w;
        w.cfg = small_config();
        w.cfg.shape = {1, 4, 1, 16};
        w.cfg.page_tokens = pt;
        w.cfg.local_tokens = local;
        w.cfg.sink_tokens = sink;
        w.prompt = {0, 1, 13, 50};  // 0: decoded without prefill
        w.steps = pt + 2;           // crosses a page boundary
        w.zero_queries = true;
        w.index_values = true;
        SUBCASE("dense") {
          KvManager<index::Dense, eviction::Lru> kv(w.cfg);
          const auto out = run(kv, w);
          const int d = 16;
          std::size_t at = 0;
          for (int step = 0; step < w.steps; ++step)
            for (int s = 0; s < static_cast<int>(w.prompt.size()); ++s, at += 4 * d) {
              const double n = w.prompt[s] + step + 1;
              CHECK(out[at + 1] == doctest::Approx((n - 1) / 2).epsilon(1e-5));            // mean of t
              CHECK(out[at] == doctest::Approx((n - 1) * (2 * n - 1) / 6).epsilon(1e-5));  // mean of t^2
            }
          // Every token of every stream, once: the count over the whole run.
          std::uint64_t tokens = 0;
          for (int step = 0; step < w.steps; ++step)
            for (int s = 0; s < static_cast<int>(w.prompt.size()); ++s) tokens += static_cast<std::uint64_t>(w.prompt[s] + step + 1);
          CHECK(kv.total_stats().attended_tokens == tokens);
        }
        SUBCASE("sparse") {
          // The oracle breaks all-equal ties toward the lowest candidate pages.
          w.cfg.budget = Budget::fraction(0.3);
          KvManager<index::Oracle, eviction::Lru> kv(w.cfg);
          const auto out = run(kv, w);
          const int d = 16;
          std::size_t at = 0;
          std::uint64_t expected_tokens = 0;
          for (int step = 0; step < w.steps; ++step)
            for (int s = 0; s < static_cast<int>(w.prompt.size()); ++s, at += 4 * d) {
              const int n = w.prompt[s] + step + 1;
              // Independent classification of every token's page (Decision 3).
              std::vector<int> candidate_pages;
              std::vector<int> always;
              const int pages = (n + pt - 1) / pt;
              for (int p = 0; p < pages; ++p) {
                const int first = p * pt, last = std::min(n, first + pt) - 1;
                if (first < sink || last >= n - local || last == n - 1)
                  for (int t = first; t <= last; ++t) always.push_back(t);
                else candidate_pages.push_back(p);
              }
              const int budget = candidate_pages.empty() ? 0 : static_cast<int>(std::ceil(0.3 * static_cast<double>(candidate_pages.size()) - 1e-9));
              std::vector<int> attended = always;
              for (int i = 0; i < budget; ++i)
                for (int t = candidate_pages[i] * pt; t < candidate_pages[i] * pt + pt; ++t) attended.push_back(t);
              double mean = 0, mean_sq = 0;
              for (int t : attended) {
                mean += t;
                mean_sq += static_cast<double>(t) * t;
              }
              mean /= static_cast<double>(attended.size());
              mean_sq /= static_cast<double>(attended.size());
              CHECK(out[at + 1] == doctest::Approx(mean).epsilon(1e-5));
              CHECK(out[at] == doctest::Approx(mean_sq).epsilon(1e-5));
              expected_tokens += attended.size();
            }
          CHECK(kv.total_stats().attended_tokens == expected_tokens);
        }
      }
}

TEST_CASE("cache path: misses are fetched, then hit while the selection repeats") {
  Workload w;
  w.cfg = small_config();
  w.cfg.shape = {1, 4, 1, 32};
  w.cfg.budget = Budget::pages(3);
  w.cfg.local_tokens = 8;
  w.prompt = {200};
  w.steps = 5;
  w.zero_queries = true;  // every step selects the same (lowest) candidate pages
  SUBCASE("window 2 keeps them") {
    KvManager<index::Oracle, eviction::Lru, FaultyTiers> kv(w.cfg, {}, eviction::Lru{2});
    run(kv, w);
    const Stats& t = kv.total_stats();
    CHECK(t.selected == 15);
    CHECK(t.misses == 3);  // the first step only
    CHECK(t.hits == 12);
    CHECK(t.in_place == 0);
    CHECK(t.bytes_read[1] == 3 * w.cfg.page_bytes());
    CHECK(kv.tiers().get<1>().reads() == 3);
  }
  SUBCASE("window 0 fetches every time") {
    KvManager<index::Oracle, eviction::Lru, FaultyTiers> kv(w.cfg, {}, eviction::Lru{0});
    run(kv, w);
    CHECK(kv.total_stats().misses == 15);
    CHECK(kv.total_stats().evictions == 15);
    CHECK(kv.cached_pages(1, 0, 0) == 0);
  }
  SUBCASE("pages on an addressable backing tier are attended in place") {
    KvManager<index::Oracle, eviction::Lru, Tiers<tier::HostTier, tier::HostTier>> kv(w.cfg);
    run(kv, w);
    CHECK(kv.total_stats().in_place == 15);
    CHECK(kv.total_stats().misses == 0);
    // Only sink, local and tail pages hold fast slots: 1 sink + up to 3 local/tail pages.
    CHECK(kv.tiers().get<0>().used_pages() <= 4);
    CHECK(kv.tiers().get<1>().stored_pages() == (200 + 5) / 4);
  }
}

TEST_CASE("outputs are bitwise identical across threads, tiers and eviction policies") {
  Workload w;
  w.cfg = small_config(DType::f16);
  w.prompt = {90, 41, 130};
  w.steps = 6;
  std::vector<float> reference;
  {
    KvManager<index::Oracle, eviction::Lru> kv(w.cfg, {}, {}, {}, {}, backend::Cpu({1}));
    reference = run(kv, w);
  }
  auto same = [&](const std::vector<float>& o) { return o.size() == reference.size() && std::memcmp(o.data(), reference.data(), o.size() * 4) == 0; };
  for (unsigned threads : {2u, 4u}) {
    KvManager<index::Oracle, eviction::Lru> kv(w.cfg, {}, {}, {}, {}, backend::Cpu({threads}));
    CHECK(same(run(kv, w)));
  }
  for (int window : {0, 1, 3}) {
    KvManager<index::Oracle, eviction::Lru, FaultyTiers> kv(w.cfg, {}, eviction::Lru{window}, {}, {}, backend::Cpu({2}));
    CHECK(same(run(kv, w)));
    CHECK(kv.total_stats().misses > 0);
  }
  {
    KvManager<index::Oracle, eviction::Lru, Tiers<tier::HostTier, tier::HostTier>> kv(w.cfg);
    CHECK(same(run(kv, w)));
  }
  {  // The last backing tier keeps every page; a capped middle one takes copies of the pages
     // sealed while decoding, while it has room (prompt pages reach it through warm_up).
    using Three = Tiers<tier::HostTier, tier::FaultTier<tier::HostTier>, tier::HostTier>;
    const std::size_t cap = 10;
    KvManager<index::Oracle, eviction::Lru, Three> kv(
        w.cfg, {}, {}, Three(tier::HostTier{}, tier::FaultTier<tier::HostTier>(tier::HostTier({cap, 64})), tier::HostTier{}));
    CHECK(same(run(kv, w)));
    std::size_t all = 0, decoded = 0;
    for (int len : w.prompt) {
      all += static_cast<std::size_t>((len + w.steps) / w.cfg.page_tokens);
      decoded += static_cast<std::size_t>((len + w.steps) / w.cfg.page_tokens - len / w.cfg.page_tokens);
    }
    const auto streams = static_cast<std::size_t>(w.cfg.shape.layers * w.cfg.shape.kv_heads);
    REQUIRE(decoded * streams > cap);  // the cap is reached
    CHECK(kv.tiers().get<2>().stored_pages() == all * streams);
    CHECK(kv.tiers().get<1>().inner().stored_pages() == cap);
  }
}

TEST_CASE("commit or nothing: a failed step leaves every sequence as it was") {
  Workload w;
  w.cfg = small_config();
  w.prompt = {60, 76};  // both seal a page at step 3 (64 and 80 tokens): four writes, two heads each
  auto setup = [&](auto& kv) {
    Workload prefill_only = w;
    prefill_only.steps = 0;
    run(kv, prefill_only);
    return std::vector<SeqId>{1, 2};
  };
  using M = KvManager<index::Oracle, eviction::Lru, FaultyTiers>;
  M clean(w.cfg, {}, eviction::Lru{1});
  const auto ids = setup(clean);
  std::vector<std::vector<float>> expect;
  for (int step = 0; step < 8; ++step)
    for (int l = 0; l < 2; ++l) expect.push_back(decode_step(clean, w, ids, l, step));

  // What a step must leave untouched when it fails, for every sequence and head.
  auto snapshot = [&](M& kv, int l) {
    std::vector<std::size_t> s{kv.tiers().template get<0>().used_pages(), kv.tiers().template get<1>().inner().stored_pages()};
    for (SeqId id : ids) {
      s.push_back(static_cast<std::size_t>(kv.length(id, l)));
      for (int h = 0; h < w.cfg.shape.kv_heads; ++h) s.push_back(kv.cached_pages(id, l, h));
    }
    return s;
  };
  for (const char* fault : {"first read", "third read", "first write", "second write"}) {
    CAPTURE(fault);
    M kv(w.cfg, {}, eviction::Lru{1});
    setup(kv);
    std::size_t at = 0;
    for (int step = 0; step < 8; ++step)
      for (int l = 0; l < 2; ++l, ++at) {
        if (step == 3 && l == 1) {
          const auto before = snapshot(kv, l);
          const std::uint64_t steps_before = kv.total_stats().steps;
          auto& tier = kv.tiers().template get<1>();
          const std::string f = fault;
          if (f == "first read") tier.fail_reads_after(0);
          if (f == "third read") tier.fail_reads_after(2);
          if (f == "first write") tier.fail_writes_after(0);
          if (f == "second write") tier.fail_writes_after(1);  // the first page written is undone
          CHECK_THROWS_WITH_AS(decode_step(kv, w, ids, l, step), doctest::Contains("injected"), Error);
          CHECK(snapshot(kv, l) == before);
          CHECK(kv.total_stats().steps == steps_before);
          tier.heal();
        }
        const auto out = decode_step(kv, w, ids, l, step);  // the retry, or a normal step
        REQUIRE(out.size() == expect[at].size());
        CHECK(std::memcmp(out.data(), expect[at].data(), out.size() * 4) == 0);
      }
    CHECK(kv.tiers().template get<1>().injected_errors() == 1);
    // The cache went through the same history as the undisturbed run.
    const Stats& a = kv.total_stats();
    const Stats& b = clean.total_stats();
    CHECK(a.steps == b.steps);
    CHECK(a.hits == b.hits);
    CHECK(a.misses == b.misses);
    CHECK(a.evictions == b.evictions);
    CHECK(a.bytes_read == b.bytes_read);
    CHECK(a.bytes_written == b.bytes_written);
    CHECK(snapshot(kv, 0) == snapshot(clean, 0));
    CHECK(snapshot(kv, 1) == snapshot(clean, 1));
  }
}

namespace {
/// An index that throws from append() when told to: a policy breaking its no-throw contract.
struct ThrowingIndex : index::Oracle {
  std::shared_ptr<bool> armed = std::make_shared<bool>(false);
  void append(State& s, const index::PageKeys& k) const {
    if (*armed) throw std::runtime_error("append failed");
    index::Oracle::append(s, k);
  }
};
static_assert(index::IndexPolicy<ThrowingIndex>);
}  // namespace

TEST_CASE("a policy that throws after the point of no return leaves the batch unusable, not corrupt") {
  Workload w;
  w.cfg = small_config();
  w.cfg.local_tokens = 0;  // sealed pages leave the fast tier at once
  w.prompt = {60, 76};
  w.steps = 3;
  ThrowingIndex index;
  KvManager<ThrowingIndex, eviction::Lru, FaultyTiers> kv(w.cfg, index);
  run(kv, w);  // steps 0..2: no seal yet
  const std::vector<SeqId> ids{1, 2};
  *index.armed = true;
  CHECK_THROWS_WITH_AS(decode_step(kv, w, ids, 0, 3), doctest::Contains("unusable: release them"), Error);
  CHECK_THROWS_WITH_AS(decode_step(kv, w, ids, 1, 3), doctest::Contains("unusable after a failed commit"), Error);
  // Pages written before the failure stay readable in the backing tier; release frees everything.
  kv.release(1);
  kv.release(2);
  CHECK(kv.tiers().get<0>().used_pages() == 0);
  CHECK(kv.tiers().get<1>().inner().stored_pages() == 0);
}

TEST_CASE("prefill in chunks equals prefill at once, and a failed prefill changes nothing") {
  Workload w;
  w.cfg = small_config();
  w.prompt = {70};
  w.steps = 3;
  KvManager<index::Oracle, eviction::Lru, FaultyTiers> whole(w.cfg);
  const auto expect = run(whole, w);

  KvManager<index::Oracle, eviction::Lru, FaultyTiers> chunked(w.cfg);
  const auto& sh = w.cfg.shape;
  const int d = sh.head_dim;
  const SeqId id = chunked.add_sequence(PrefixDigest::of_tokens(std::vector<std::int32_t>{1, 2, 3}));
  CHECK(chunked.prefix_digest(id) == PrefixDigest::of_tokens(std::vector<std::int32_t>{1, 2, 3}));
  for (int l = 0; l < sh.layers; ++l) {
    int t0 = 0;
    for (int chunk : {13, 30, 27}) {
      std::vector<float> k, v;
      for (int t = t0; t < t0 + chunk; ++t) {
        auto kr = w.key(0, l, t), vr = w.value(0, l, t);
        k.insert(k.end(), kr.begin(), kr.end());
        v.insert(v.end(), vr.begin(), vr.end());
      }
      if (l == 1 && t0 == 13) {  // a failing chunk leaves the stream as it was
        const auto used = chunked.tiers().get<0>().used_pages();
        const auto stored = chunked.tiers().get<1>().inner().stored_pages();
        chunked.tiers().get<1>().fail_writes_after(5);  // five pages written, then a failure
        CHECK_THROWS_AS(chunked.prefill(id, l, make_view(k, chunk, sh.kv_heads, d), make_view(v, chunk, sh.kv_heads, d)), Error);
        chunked.tiers().get<1>().heal();
        CHECK(chunked.length(id, l) == 13);
        CHECK(chunked.tiers().get<0>().used_pages() == used);
        CHECK(chunked.tiers().get<1>().inner().stored_pages() == stored);  // the five are undone
      }
      chunked.prefill(id, l, make_view(k, chunk, sh.kv_heads, d), make_view(v, chunk, sh.kv_heads, d));
      t0 += chunk;
    }
  }
  std::vector<float> got;
  const SeqId ids[] = {id};
  for (int step = 0; step < w.steps; ++step)
    for (int l = 0; l < sh.layers; ++l) {
      const auto out = decode_step(chunked, w, ids, l, step);
      got.insert(got.end(), out.begin(), out.end());
    }
  CHECK(std::memcmp(got.data(), expect.data(), got.size() * 4) == 0);
}

TEST_CASE("bad input throws kvdrive::Error naming the problem") {
  Config c = small_config();
  {
    Config z = c;
    z.shape.q_heads = 0;
    CHECK_THROWS_WITH_AS((KvManager<index::Dense, eviction::Lru>(z)), doctest::Contains("zero heads"), Error);
  }
  KvManager<index::Dense, eviction::Lru> kv(c);
  const auto& sh = c.shape;
  const int d = sh.head_dim;
  std::vector<float> q(static_cast<std::size_t>(sh.q_heads) * d), k(static_cast<std::size_t>(sh.kv_heads) * d), out(q.size());
  const SeqId id = kv.add_sequence();
  const SeqId batch[] = {id};
  auto attend = [&](int layer, std::span<const SeqId> b, int qd = 64) {
    kv.attend(layer, b, make_view(q.data(), 1, sh.q_heads, qd), make_view(k, 1, sh.kv_heads, d), make_view(k, 1, sh.kv_heads, d),
              make_view(out, 1, sh.q_heads, d));
  };
  CHECK_NOTHROW(attend(0, batch));
  CHECK_THROWS_WITH_AS(attend(0, batch, 32), doctest::Contains("head_dim 32 does not match the config's 64"), Error);
  CHECK_THROWS_WITH_AS(attend(2, batch), doctest::Contains("layer 2 out of range [0, 2)"), Error);
  CHECK_THROWS_WITH_AS(attend(-1, batch), doctest::Contains("layer -1 out of range"), Error);
  const SeqId unknown[] = {99};
  CHECK_THROWS_WITH_AS(attend(0, unknown), doctest::Contains("unknown sequence 99"), Error);
  const SeqId twice[] = {id, id};
  std::vector<float> q2(2 * q.size()), k2(2 * k.size()), o2(2 * q.size());
  CHECK_THROWS_WITH_AS(kv.attend(0, twice, make_view(q2, 2, sh.q_heads, d), make_view(k2, 2, sh.kv_heads, d), make_view(k2, 2, sh.kv_heads, d),
                                 make_view(o2, 2, sh.q_heads, d)),
                       doctest::Contains("appears twice"), Error);
  CHECK_THROWS_WITH_AS(kv.attend(0, batch, make_view(q2, 2, sh.q_heads, d), make_view(k, 1, sh.kv_heads, d), make_view(k, 1, sh.kv_heads, d),
                                 make_view(out, 1, sh.q_heads, d)),
                       doctest::Contains("expected 1 (the batch size)"), Error);
  CHECK_THROWS_WITH_AS(kv.prefill(id, 0, make_view(k, 1, sh.kv_heads, d), make_view(k, 1, sh.kv_heads, d)), doctest::Contains("prefill comes first"),
                       Error);
  kv.release(id);
  CHECK_THROWS_WITH_AS(attend(0, batch), doctest::Contains("sequence 1 was released"), Error);
  CHECK_THROWS_WITH_AS(kv.release(id), doctest::Contains("was released"), Error);
  CHECK(kv.sequences() == 0);
}

TEST_CASE("release frees every page in every tier") {
  Workload w;
  w.cfg = small_config();
  w.prompt = {50, 33};
  w.steps = 5;
  KvManager<index::Oracle, eviction::Lru, FaultyTiers> kv(w.cfg);
  run(kv, w);
  CHECK(kv.tiers().get<1>().inner().stored_pages() > 0);
  kv.release(1);
  kv.release(2);
  CHECK(kv.tiers().get<0>().used_pages() == 0);
  CHECK(kv.tiers().get<1>().inner().stored_pages() == 0);
  CHECK(kv.index_bytes() == 0);
}

namespace {
/// The queries of the last `obs` prompt positions of sequence s, layer l: [obs][q_heads][head_dim].
std::vector<float> observation_queries(const Workload& w, int s, int l, int obs) {
  std::vector<float> q;
  for (int t = w.prompt[s] - obs; t < w.prompt[s]; ++t) {
    auto qr = w.query(s, l, t);
    q.insert(q.end(), qr.begin(), qr.end());
  }
  return q;
}

/// Prefill only, then a warm-up of every layer from the prompt's last `obs` queries.
template <class Manager>
std::vector<SeqId> prefill_and_warm(Manager& kv, const Workload& w, int obs) {
  Workload prefill_only = w;
  prefill_only.steps = 0;
  run(kv, prefill_only);
  std::vector<SeqId> ids;
  const auto& sh = w.cfg.shape;
  for (int s = 0; s < static_cast<int>(w.prompt.size()); ++s) {
    ids.push_back(static_cast<SeqId>(s + 1));
    for (int l = 0; l < sh.layers; ++l) {
      const std::vector<float> q = observation_queries(w, s, l, obs);
      kv.warm_up(ids.back(), l, make_view(q, obs, sh.q_heads, sh.head_dim));
    }
  }
  return ids;
}
}  // namespace

TEST_CASE("every index policy runs inside KvManager; at budget 1 each attends exactly what Dense does") {
  Workload w;
  w.cfg = small_config(DType::f16);
  w.prompt = {150, 61};
  w.steps = 9;  // seals pages during decode, so append() runs too
  auto outputs = [&](auto index, double budget) {
    Workload x = w;
    x.cfg.budget = Budget::fraction(budget);
    KvManager<decltype(index), eviction::Lru> kv(x.cfg, index);
    return run(kv, x);
  };
  const auto dense = outputs(index::Dense{}, 1.0);
  auto check_index = [&](auto index) {
    CAPTURE(decltype(index)::name());
    CHECK(outputs(index, 1.0) == dense);
    const auto sparse = outputs(index, 0.25);
    for (float x : sparse) REQUIRE(std::isfinite(x));
    // Through a slow tier and the lookahead cache, with warm-up, the output is the same.
    Workload x = w;
    x.cfg.budget = Budget::fraction(0.25);
    KvManager<decltype(index), eviction::Lookahead, FaultyTiers> kv(x.cfg, index);
    const auto ids = prefill_and_warm(kv, x, 8);
    std::vector<float> cached;
    for (int step = 0; step < x.steps; ++step)
      for (int l = 0; l < x.cfg.shape.layers; ++l) {
        const auto o = decode_step(kv, x, ids, l, step);
        cached.insert(cached.end(), o.begin(), o.end());
      }
    CHECK(cached == sparse);
    CHECK(kv.total_stats().hits > 0);
    CHECK(kv.total_stats().hits + kv.total_stats().misses == kv.total_stats().selected);
  };
  check_index(index::Quest{});
  check_index(index::MeanKey{});
  check_index(index::Hierarchical{index::HierarchicalParams{.pages_per_cluster = 4}});
  check_index(index::Centroid{index::CentroidParams{.pages_per_cluster = 4, .segment_pages = 16}});
  check_index(index::SimHash{});
  check_index(index::ProductQuant{index::ProductQuant::Params{.M = 8, .C = 16, .train_pages = 16}});
  check_index(index::TokenRescore<index::Hierarchical>{index::Hierarchical{index::HierarchicalParams{.pages_per_cluster = 4}}, {.pool = 2}});
  // Parameters that do not fit the model's head_dim are refused when the manager is built.
  CHECK_THROWS_WITH_AS((KvManager<index::ProductQuant, eviction::Lru>(w.cfg, index::ProductQuant{index::ProductQuant::Params{.M = 7}})),
                       doctest::Contains("do not divide head_dim"), Error);
}

TEST_CASE("outputs are bitwise identical for every eviction policy, window plan and warm-up") {
  Workload w;
  w.cfg = small_config(DType::f16);
  w.cfg.local_tokens = 8;
  w.prompt = {150, 97};
  w.steps = 7;
  std::vector<float> reference;
  {
    KvManager<index::Quest, eviction::None, FaultyTiers> kv(w.cfg);
    reference = run(kv, w);
    CHECK(kv.total_stats().hits == 0);  // W = 0: every selected page is a miss
    CHECK(kv.total_stats().misses == kv.total_stats().selected);
  }
  auto check = [&](auto& kv, const char* what, bool warm) {
    CAPTURE(what);
    CAPTURE(warm);
    std::vector<float> out;
    std::uint64_t reads_before_decode = 0;
    if (warm) {
      const auto ids = prefill_and_warm(kv, w, 12);
      reads_before_decode = kv.tiers().template get<1>().reads();  // warm-up reads keys to score, and the warm pages
      for (int step = 0; step < w.steps; ++step)
        for (int l = 0; l < w.cfg.shape.layers; ++l) {
          const auto o = decode_step(kv, w, ids, l, step);
          out.insert(out.end(), o.begin(), o.end());
        }
    } else {
      out = run(kv, w);
    }
    REQUIRE(out.size() == reference.size());
    CHECK(std::memcmp(out.data(), reference.data(), out.size() * 4) == 0);
    const Stats& t = kv.total_stats();
    CHECK(t.hits + t.misses == t.selected);
    // Every miss is one read of the slow tier.
    CHECK(kv.tiers().template get<1>().reads() - reads_before_decode == t.misses);
    return t;
  };
  for (bool warm : {false, true}) {
    for (int window : {0, 1, 3}) {
      KvManager<index::Quest, eviction::Lookahead, FaultyTiers> la(w.cfg, {}, eviction::Lookahead{window});
      check(la, "lookahead", warm);
      KvManager<index::Quest, eviction::Lru, FaultyTiers> lru(w.cfg, {}, eviction::Lru{window});
      check(lru, "lru", warm);
      KvManager<index::Quest, eviction::Lfu, FaultyTiers> lfu(w.cfg, {}, eviction::Lfu{window});
      check(lfu, "lfu", warm);
    }
    KvManager<index::Quest, eviction::LastStep, FaultyTiers> last(w.cfg);
    check(last, "last-step", warm);
    // A plan with a different W per (layer, head), as the knapsack makes.
    KvManager<index::Quest, eviction::Lookahead, FaultyTiers> planned(w.cfg);
    eviction::WindowPlan plan = eviction::WindowPlan::uniform(w.cfg.shape, 0);
    plan.windows = {0, 4, 2, 1};
    planned.set_window_plan(plan);
    CHECK(planned.window_of(0, 1) == 4);
    check(planned, "lookahead with a plan", warm);
    for (SeqId id : {SeqId{1}, SeqId{2}}) {
      CHECK(planned.cached_pages(id, 0, 0) == 0);  // W = 0 keeps nothing
      CHECK(planned.cached_pages(id, 0, 1) > 0);
    }
  }
}

TEST_CASE("warm-up fills the cache at step 0, so the first step hits") {
  Workload w;
  w.cfg = small_config();
  w.cfg.local_tokens = 8;
  w.prompt = {200};
  w.steps = 1;
  KvManager<index::Quest, eviction::Lookahead, FaultyTiers> cold(w.cfg), hot(w.cfg);
  run(cold, w);
  const auto ids = prefill_and_warm(hot, w, 16);
  const PageRanges r = page_ranges(201, w.cfg.page_tokens, w.cfg.sink_tokens, w.cfg.local_tokens);
  const std::size_t capacity = 3 * static_cast<std::size_t>(w.cfg.budget.pages_for(r.candidates()));
  for (int l = 0; l < w.cfg.shape.layers; ++l)
    for (int h = 0; h < w.cfg.shape.kv_heads; ++h)
      CHECK(hot.cached_pages(ids[0], l, h) == std::min<std::size_t>(capacity, static_cast<std::size_t>(r.candidates())));
  CHECK(hot.total_stats().warmed == 4 * std::min<std::size_t>(capacity, static_cast<std::size_t>(r.candidates())));
  for (int l = 0; l < w.cfg.shape.layers; ++l) decode_step(hot, w, ids, l, 0);
  CHECK(cold.total_stats().hits == 0);
  CHECK(hot.total_stats().hits > 0);
  CHECK(hot.total_stats().selected == cold.total_stats().selected);
  // Bad input: the wrong head count, or more observation queries than prompt tokens.
  std::vector<float> q(static_cast<std::size_t>(4) * 3 * 64);
  CHECK_THROWS_WITH_AS(hot.warm_up(ids[0], 0, make_view(q, 4, 3, 64)), doctest::Contains("q_heads"), Error);
  KvManager<index::Quest, eviction::Lookahead, FaultyTiers> fresh(w.cfg);
  const SeqId id = fresh.add_sequence();
  std::vector<float> q8(static_cast<std::size_t>(8) * 64);
  CHECK_THROWS_WITH_AS(fresh.warm_up(id, 0, make_view(q8, 1, 8, 64)), doctest::Contains("observation queries for a prompt of 0"), Error);
  // After decoding, warm-up is refused.
  CHECK_THROWS_WITH_AS(hot.warm_up(ids[0], 0, make_view(q8, 1, 8, 64)), doctest::Contains("already decoded"), Error);
}

TEST_CASE("a failed warm-up changes nothing") {
  Workload w;
  w.cfg = small_config();
  w.cfg.local_tokens = 8;
  w.prompt = {200};
  w.steps = 0;
  KvManager<index::Quest, eviction::Lookahead, FaultyTiers> kv(w.cfg), clean(w.cfg);
  run(kv, w);
  const auto ids = prefill_and_warm(clean, w, 16);
  const auto& sh = w.cfg.shape;
  const std::vector<float> q = observation_queries(w, 0, 0, 16);
  const std::size_t used = kv.tiers().get<0>().used_pages();
  // Per head: 47 pages read back to score, then 36 warm pages read (3 x a 12-page budget).
  for (std::uint64_t fail_after : {0u, 50u, 100u, 140u}) {
    CAPTURE(fail_after);
    kv.tiers().get<1>().fail_reads_after(fail_after);
    CHECK_THROWS_WITH_AS(kv.warm_up(ids[0], 0, make_view(q, 16, sh.q_heads, sh.head_dim)), doctest::Contains("injected"), Error);
    kv.tiers().get<1>().heal();
    CHECK(kv.tiers().get<0>().used_pages() == used);
    for (int h = 0; h < sh.kv_heads; ++h) CHECK(kv.cached_pages(ids[0], 0, h) == 0);
    CHECK(kv.total_stats().warmed == 0);
  }
  // Healed, it warms the same pages as an undisturbed manager.
  kv.warm_up(ids[0], 0, make_view(q, 16, sh.q_heads, sh.head_dim));
  for (int h = 0; h < sh.kv_heads; ++h) CHECK(kv.cached_pages(ids[0], 0, h) == clean.cached_pages(ids[0], 0, h));
}

TEST_CASE("placement: the best pages go to the cache, the next to the middle tier, all to the last") {
  Workload w;
  w.cfg = small_config();
  w.cfg.local_tokens = 8;
  w.prompt = {200};
  w.steps = 6;
  const auto& sh = w.cfg.shape;
  const int obs = 16, pt = w.cfg.page_tokens, g = w.cfg.group(), d = sh.head_dim;
  using Slow = tier::FaultTier<tier::HostTier>;
  using Three = Tiers<tier::HostTier, Slow, Slow>;
  const std::size_t middle_pages = 24;  // 6 per stream: 24 / (2 layers x 2 heads)
  auto three = [&] { return Three(tier::HostTier{}, Slow(tier::HostTier({middle_pages, 64})), Slow(tier::HostTier{})); };
  KvManager<index::Quest, eviction::Lookahead, Three> kv(w.cfg, {}, {}, three());
  const auto ids = prefill_and_warm(kv, w, obs);
  // Before warm-up the last tier held every sealed page and the middle one none; now the middle
  // one holds, per stream, the 6 best-ranked pages after the cache's W x budget.
  const PageRanges r = page_ranges(w.prompt[0] + 1, pt, w.cfg.sink_tokens, w.cfg.local_tokens);
  const std::size_t capacity = 3 * static_cast<std::size_t>(w.cfg.budget.pages_for(r.candidates()));
  const std::size_t sealed = static_cast<std::size_t>(w.prompt[0] / pt);
  const tier::ImportanceGuided placement;
  for (int l = 0; l < sh.layers; ++l)
    for (int h = 0; h < sh.kv_heads; ++h) {
      CAPTURE(l);
      CAPTURE(h);
      std::vector<float> keys, q;
      for (int t = 0; t < w.prompt[0]; ++t) {
        const auto k = w.key(0, l, t);
        keys.insert(keys.end(), k.begin() + h * d, k.begin() + (h + 1) * d);
      }
      for (int t = w.prompt[0] - obs; t < w.prompt[0]; ++t) {
        const auto qr = w.query(0, l, t);
        q.insert(q.end(), qr.begin() + h * g * d, qr.begin() + (h + 1) * g * d);
      }
      tier::PlacementInput in;
      in.keys = keys.data();
      in.tokens = w.prompt[0];
      in.queries = q.data();
      in.observed = obs;
      in.group = g;
      in.head_dim = d;
      in.page_tokens = pt;
      in.scale = w.cfg.scale();
      const tier::PageRanking ranking = placement.rank(in, static_cast<std::uint32_t>(r.sink_end), static_cast<std::uint32_t>(r.local_begin));
      REQUIRE(ranking.pages.size() >= capacity + 6);
      std::vector<char> middle(sealed, 0);
      for (std::size_t i = capacity; i < capacity + 6; ++i) middle[ranking.pages[i]] = 1;
      CHECK(kv.cached_pages(ids[0], l, h) == capacity);
      for (std::uint32_t p = 0; p < sealed; ++p) {
        const tier::PageKey key{ids[0], static_cast<std::uint32_t>(l), static_cast<std::uint32_t>(h), p};
        CHECK(kv.tiers().get<2>().contains(key));
        CHECK(kv.tiers().get<1>().contains(key) == static_cast<bool>(middle[p]));
      }
    }
  CHECK(kv.total_stats().placed == middle_pages);
  CHECK(kv.total_stats().bytes_written[1] == middle_pages * w.cfg.page_bytes());
  // Decoding reads the placed pages from the middle tier, and computes exactly what a manager
  // without the middle tier computes.
  KvManager<index::Quest, eviction::Lookahead, FaultyTiers> two(w.cfg);
  const auto ids2 = prefill_and_warm(two, w, obs);
  for (int step = 0; step < w.steps; ++step)
    for (int l = 0; l < sh.layers; ++l) {
      const auto a = decode_step(kv, w, ids, l, step), b = decode_step(two, w, ids2, l, step);
      REQUIRE(a.size() == b.size());
      CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    }
  CHECK(kv.total_stats().misses == two.total_stats().misses);
  CHECK(kv.total_stats().bytes_read[1] > 0);
  // The same pages were read, some from the middle tier (warm-up copied the placed pages from
  // the bytes it read to score them, with no read of its own).
  CHECK(kv.total_stats().bytes_read[1] + kv.total_stats().bytes_read[2] == two.total_stats().bytes_read[1]);
  // Pages sealed while decoding went to the last tier, with a copy in the middle one.
  CHECK(kv.tiers().get<2>().inner().stored_pages() == two.tiers().get<1>().inner().stored_pages());
  CHECK(kv.tiers().get<1>().inner().stored_pages() == middle_pages);  // full: no room for copies
  kv.release(ids[0]);
  CHECK(kv.tiers().get<1>().inner().stored_pages() == 0);
  CHECK(kv.tiers().get<2>().inner().stored_pages() == 0);
}

TEST_CASE("a warm-up whose middle-tier copy fails changes nothing") {
  Workload w;
  w.cfg = small_config();
  w.cfg.local_tokens = 8;
  w.prompt = {200};
  w.steps = 0;
  using Slow = tier::FaultTier<tier::HostTier>;
  using Three = Tiers<tier::HostTier, Slow, Slow>;
  KvManager<index::Quest, eviction::Lookahead, Three> kv(w.cfg, {}, {},
                                                         Three(tier::HostTier{}, Slow(tier::HostTier({40, 64})), Slow(tier::HostTier{})));
  run(kv, w);
  const auto& sh = w.cfg.shape;
  const std::vector<float> q = observation_queries(w, 0, 0, 16);
  const std::size_t used = kv.tiers().get<0>().used_pages();
  for (std::uint64_t fail_after : {0u, 5u}) {  // the first head's copies, or the second's
    CAPTURE(fail_after);
    kv.tiers().get<1>().fail_writes_after(fail_after);
    CHECK_THROWS_WITH_AS(kv.warm_up(1, 0, make_view(q, 16, sh.q_heads, sh.head_dim)), doctest::Contains("injected"), Error);
    kv.tiers().get<1>().heal();
    CHECK(kv.tiers().get<1>().inner().stored_pages() == 0);
    CHECK(kv.tiers().get<0>().used_pages() == used);
    for (int h = 0; h < sh.kv_heads; ++h) CHECK(kv.cached_pages(1, 0, h) == 0);
    CHECK(kv.total_stats().placed == 0);
  }
  kv.warm_up(1, 0, make_view(q, 16, sh.q_heads, sh.head_dim));
  CHECK(kv.total_stats().placed == 2 * (40 / (2 * 2)));
  CHECK(kv.tiers().get<1>().inner().stored_pages() == 20);
}

// ---- the manager's units (include/kvdrive/manager/) ---------------------------------------------

TEST_CASE("SequenceTable: ids are never reused, released and unknown ids are told apart, adopt keeps later ids above") {
  struct Seq {
    bool broken = false;
  };
  manager::SequenceTable<Seq> t;
  const SeqId a = t.add().first, b = t.add().first;
  CHECK(a == 1);
  CHECK(b == 2);
  t.erase(a);
  CHECK_THROWS_WITH_AS(t.find(a), doctest::Contains("sequence 1 was released"), Error);
  CHECK_THROWS_WITH_AS(t.find(7), doctest::Contains("unknown sequence 7"), Error);
  CHECK(t.add().first == 3);  // a released id is not handed out again
  t.mark_broken(b);
  CHECK_NOTHROW(t.find(b));
  CHECK_THROWS_WITH_AS(t.usable(b), doctest::Contains("sequence 2 is unusable"), Error);
  t.adopt(10);
  CHECK_THROWS_WITH_AS(t.adopt(10), doctest::Contains("already in use"), Error);
  CHECK_THROWS_AS(t.adopt(0), Error);
  CHECK(t.add().first == 11);
  CHECK(t.size() == 4);  // 2, 3, 10, 11
}

TEST_CASE("PageEdit: undo (or destruction before keep) frees its slots and erases its pages; keep leaves them") {
  using T = Tiers<tier::HostTier, tier::HostTier>;
  T tiers(tier::HostTier({4, 64}), tier::HostTier({4, 64}));
  tiers.open(tier::TierGeometry{4096});
  const std::vector<std::byte> bytes(4096, std::byte{7});
  const auto store = [&](manager::PageEdit<T>& e, std::uint32_t page) {
    const tier::PageKey key{1, 0, 0, page};
    tiers.get<1>().write(key, bytes.data());
    e.written().push_back({1, key});
  };
  {
    manager::PageEdit<T> e(tiers);
    e.new_slot();
    e.new_slot();
    store(e, 0);
    CHECK(tiers.fast().free_pages() == 2);
    CHECK(tiers.get<1>().free_pages() == 3);
  }  // never kept: undone
  CHECK(tiers.fast().free_pages() == 4);
  CHECK(tiers.get<1>().free_pages() == 4);
  CHECK_FALSE(tiers.get<1>().contains({1, 0, 0, 0}));

  PageTable table;
  table.push_back(PageEntry{});
  {
    manager::PageEdit<T> e(tiers);
    table[0].slot = e.new_slot();
    store(e, 0);
    e.set_home(table, 0, 1);
    CHECK(table[0].home == 0);  // homes change at apply()
    e.apply();
  }
  CHECK(table[0].home == 1);
  CHECK(tiers.fast().free_pages() == 3);  // the table owns the slot now
  CHECK(tiers.get<1>().contains({1, 0, 0, 0}));
}

namespace {

/// A stream built for the focus carry (Config::carry): head_dim 16, 4-token pages, no sink, 4
/// local tokens, a budget of 2 pages, one query head. Page 3 holds one "needle" key (8 e0 + 8 e1)
/// among three keys of -4 e0, so its mean key is -1 along e0; pages 5 and 6 hold +1 e0 everywhere.
/// Step 0 asks along e1 (MeanKey ranks page 3 first: mean +2 there) and its attention lands on the
/// needle; step 1 asks along e0, where MeanKey ranks page 3 last although the needle still takes
/// nearly all of the attention.
struct NeedleStream {
  static constexpr int kDim = 16, kPrompt = 32;
  Config cfg;
  NeedleStream() {
    cfg.shape = {1, 1, 1, kDim};
    cfg.page_tokens = 4;
    cfg.dtype = DType::f32;
    cfg.sink_tokens = 0;
    cfg.local_tokens = 4;
    cfg.budget = Budget::pages(2);
  }
  std::vector<float> key(int t) const {
    auto k = test::random_floats(kDim, 100 + static_cast<std::uint64_t>(t));
    for (float& x : k) x *= 0.05f;
    if (t == 12) k[0] = 8, k[1] = 8;
    else if (t >= 13 && t < 16) k[0] = -4;
    else if (t >= 20 && t < 28) k[0] = 1;
    return k;
  }
  std::vector<float> value(int t) const { return test::random_floats(kDim, 5000 + static_cast<std::uint64_t>(t)); }
  std::vector<float> query(int step) const {
    std::vector<float> q(kDim, 0.0f);
    q[step == 0 ? 1 : 0] = 4;
    return q;
  }
  /// Attention of the query of `step` over the tokens of `pages` and the tokens from `first_always`
  /// on (local and tail), in double.
  std::vector<double> reference(int step, std::vector<int> pages, int first_always) const {
    const int n = kPrompt + step + 1;
    std::vector<int> tokens;
    for (int p : pages)
      for (int t = p * 4; t < p * 4 + 4; ++t) tokens.push_back(t);
    for (int t = first_always; t < n; ++t) tokens.push_back(t);
    const auto q = query(step);
    std::vector<double> w, out(kDim, 0.0);
    double m = -1e300, sum = 0;
    for (int t : tokens) {
      const auto k = key(t);
      double s = 0;
      for (int i = 0; i < kDim; ++i) s += static_cast<double>(q[i]) * k[i];
      w.push_back(s * 0.25);
      m = std::max(m, w.back());
    }
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const double e = std::exp(w[i] - m);
      sum += e;
      const auto v = value(tokens[i]);
      for (int j = 0; j < kDim; ++j) out[j] += e * v[j];
    }
    for (double& x : out) x /= sum;
    return out;
  }
  /// Prefills the prompt and runs steps 0 and 1; returns both steps' outputs.
  template <class Manager>
  std::vector<float> run(Manager& kv) const {
    const SeqId id = kv.add_sequence();
    std::vector<float> k, v;
    for (int t = 0; t < kPrompt; ++t) {
      auto kr = key(t), vr = value(t);
      k.insert(k.end(), kr.begin(), kr.end());
      v.insert(v.end(), vr.begin(), vr.end());
    }
    kv.prefill(id, 0, make_view(k, kPrompt, 1, kDim), make_view(v, kPrompt, 1, kDim));
    std::vector<float> all;
    for (int step = 0; step < 2; ++step) {
      auto q = query(step), kr = key(kPrompt + step), vr = value(kPrompt + step);
      std::vector<float> out(kDim);
      const SeqId ids[] = {id};
      kv.attend(0, ids, make_view(q, 1, 1, kDim), make_view(kr, 1, 1, kDim), make_view(vr, 1, 1, kDim), make_view(out, 1, 1, kDim));
      all.insert(all.end(), out.begin(), out.end());
    }
    return all;
  }
};

void check_close(std::span<const float> got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-4));
}

}  // namespace

TEST_CASE("focus carry: a page the last step attended heavily stays selected, within the budget") {
  const NeedleStream ns;
  constexpr int d = NeedleStream::kDim;
  // Step 0: 33 tokens, pages 0..8; local covers tokens 29..32 (pages 7 and 8): candidates 0..6.
  // MeanKey along e1 ranks page 3 first; the other page is the next best mean along e1.
  auto best_other = [&](int step, std::vector<int> exclude) {
    const auto q = ns.query(step);
    int best = -1;
    double best_score = -1e300;
    for (int p = 0; p < 7; ++p) {
      if (std::find(exclude.begin(), exclude.end(), p) != exclude.end()) continue;
      double s = 0;
      for (int t = p * 4; t < p * 4 + 4; ++t) {
        const auto k = ns.key(t);
        for (int i = 0; i < d; ++i) s += static_cast<double>(q[i]) * k[i];
      }
      if (s > best_score) best_score = s, best = p;
    }
    return best;
  };
  const int step0_other = best_other(0, {3});
  REQUIRE(step0_other != 3);
  SUBCASE("off: step 1 loses the needle's page to pages 5 and 6") {
    Config c = ns.cfg;
    c.carry.share = 0.0f;
    KvManager<index::MeanKey, eviction::Lru> kv(c);
    const auto out = ns.run(kv);
    check_close(std::span<const float>(out).first(d), ns.reference(0, {std::min(3, step0_other), std::max(3, step0_other)}, 28));
    check_close(std::span<const float>(out).subspan(d), ns.reference(1, {5, 6}, 28));
    CHECK(kv.total_stats().selected == 4);
  }
  SUBCASE("on: page 3 stays selected beside MeanKey's best, still 2 pages a step") {
    Config c = ns.cfg;
    c.carry = FocusCarry{.mass = 0.05f, .share = 0.5f};  // floor(0.5 x 2) = 1 page may be carried
    KvManager<index::MeanKey, eviction::Lru> kv(c);
    const auto out = ns.run(kv);
    check_close(std::span<const float>(out).first(d), ns.reference(0, {std::min(3, step0_other), std::max(3, step0_other)}, 28));
    check_close(std::span<const float>(out).subspan(d), ns.reference(1, {3, 5}, 28));
    CHECK(kv.total_stats().selected == 4);
    // The same bits whatever the tiers, window and threads (Decision 2).
    for (int window : {0, 2}) {
      KvManager<index::MeanKey, eviction::Lru, FaultyTiers> tiered(c, {}, eviction::Lru{window}, {}, {}, backend::Cpu({2}));
      CHECK(ns.run(tiered) == out);
      CHECK(tiered.total_stats().misses > 0);
    }
  }
  SUBCASE("a share too small for one page carries nothing") {
    Config c = ns.cfg;
    c.carry.share = 0.25f;  // floor(0.25 x 2) = 0
    KvManager<index::MeanKey, eviction::Lru> kv(c);
    const auto out = ns.run(kv);
    check_close(std::span<const float>(out).subspan(d), ns.reference(1, {5, 6}, 28));
  }
  SUBCASE("a page below the mass threshold is not carried") {
    Config c = ns.cfg;
    c.carry = FocusCarry{.mass = 1.0f, .share = 0.5f};  // the needle takes nearly all, never all
    KvManager<index::MeanKey, eviction::Lru> kv(c);
    const auto out = ns.run(kv);
    check_close(std::span<const float>(out).subspan(d), ns.reference(1, {5, 6}, 28));
  }
}

TEST_CASE("observation pins: the page the prompt's last query attended stays selected, within the budget") {
  const NeedleStream ns;
  constexpr int d = NeedleStream::kDim;
  // The prompt's last query asks along e1, as step 0 does: its attention lands on the needle
  // (token 12, page 3). Step 1 asks along e0, where MeanKey ranks page 3 last.
  const std::vector<float> q_obs = ns.query(0);
  const tier::ImportanceGuided placement{.observation = 1, .pool_kernel = 1};
  auto run = [&](auto& kv) {
    // NeedleStream::run with warm_up between prefill and the steps.
    const SeqId id = kv.add_sequence();
    std::vector<float> k, v;
    for (int t = 0; t < NeedleStream::kPrompt; ++t) {
      auto kr = ns.key(t), vr = ns.value(t);
      k.insert(k.end(), kr.begin(), kr.end());
      v.insert(v.end(), vr.begin(), vr.end());
    }
    kv.prefill(id, 0, make_view(k, NeedleStream::kPrompt, 1, d), make_view(v, NeedleStream::kPrompt, 1, d));
    kv.warm_up(id, 0, make_view(q_obs, 1, 1, d), placement);
    std::vector<float> all;
    for (int step = 0; step < 2; ++step) {
      auto q = ns.query(step), kr = ns.key(NeedleStream::kPrompt + step), vr = ns.value(NeedleStream::kPrompt + step);
      std::vector<float> out(d);
      const SeqId ids[] = {id};
      kv.attend(0, ids, make_view(q, 1, 1, d), make_view(kr, 1, 1, d), make_view(vr, 1, 1, d), make_view(out, 1, 1, d));
      all.insert(all.end(), out.begin(), out.end());
    }
    return all;
  };
  Config c = ns.cfg;
  c.carry.share = 0.0f;
  SUBCASE("off: step 1 takes MeanKey's pages 5 and 6") {
    KvManager<index::MeanKey, eviction::Lru> kv(c);
    const auto out = run(kv);
    check_close(std::span<const float>(out).subspan(d), ns.reference(1, {5, 6}, 28));
  }
  SUBCASE("on: page 3 is pinned beside MeanKey's best, 2 pages a step, the same bits on every tier") {
    c.pins.share = 0.5f;  // floor(0.5 x 2) = 1 pinned page
    KvManager<index::MeanKey, eviction::Lru> kv(c);
    const auto out = run(kv);
    check_close(std::span<const float>(out).subspan(d), ns.reference(1, {3, 5}, 28));
    CHECK(kv.total_stats().selected == 4);
    for (int window : {0, 2}) {
      KvManager<index::MeanKey, eviction::Lru, FaultyTiers> tiered(c, {}, eviction::Lru{window}, {}, {}, backend::Cpu({2}));
      CHECK(run(tiered) == out);
    }
  }
  SUBCASE("pins and carry together never leave the index without budget") {
    c.pins.share = 0.5f;
    c.carry.share = 0.5f;
    CHECK_THROWS_AS((KvManager<index::MeanKey, eviction::Lru>(c)), Error);
  }
}

TEST_CASE("kept_pages: pins first, within the candidates and their cap, then carried pages, none twice") {
  index::IndexQuery q;
  q.first_candidate = 2;
  q.end_candidate = 40;
  q.budget_pages = 8;
  const std::uint32_t pinned[] = {1, 30, 7, 12, 5};  // page 1 is no candidate
  const std::uint32_t carried[] = {7, 20, 21, 22};
  const FocusCarry carry{.mass = 0.05f, .share = 0.25f};
  std::vector<std::uint32_t> out;
  const FocusCarry rule = manager::kept_pages(carry, ObservationPins{.share = 0.25f}, pinned, carried, q, out);
  CHECK(out == std::vector<std::uint32_t>{30, 7, 20, 21});  // floor(0.25 x 8) = 2 of each; 7 not twice
  CHECK(rule.share == 0.5f);
  CHECK(rule.pages_for(q.budget_pages) >= static_cast<std::int64_t>(out.size()));
  const FocusCarry same = manager::kept_pages(carry, ObservationPins{}, pinned, carried, q, out);  // pins off
  CHECK(out == std::vector<std::uint32_t>(std::begin(carried), std::end(carried)));
  CHECK(same.share == carry.share);
}

TEST_CASE("focus carry: carried pages are the heavy ones, heaviest first; the merge never exceeds the budget") {
  // Three selected pages of a group of two heads: masses (0.6, 0.1), (0.02, 0.03), (0.2, 0.7).
  const std::uint32_t selected[] = {4, 9, 12};
  const float lse[] = {0.0f, 0.0f};  // totals: log 1, so a page's mass is exp(page_lse)
  const float page_lse[] = {std::log(0.6f), std::log(0.1f), std::log(0.02f), std::log(0.03f), std::log(0.2f), std::log(0.7f)};
  std::vector<std::uint32_t> out;
  manager::carried_pages(FocusCarry{.mass = 0.05f, .share = 0.5f}, selected, page_lse, lse, out);
  CHECK(out == std::vector<std::uint32_t>{12, 4});  // max over heads: 0.7, 0.6; page 9's 0.03 is below
  manager::carried_pages(FocusCarry{.mass = 0.65f, .share = 0.5f}, selected, page_lse, lse, out);
  CHECK(out == std::vector<std::uint32_t>{12});
  manager::carried_pages(FocusCarry{.mass = 0.05f, .share = 0.0f}, selected, page_lse, lse, out);
  CHECK(out.empty());

  // The merge against an index whose answers are not nested (a different set for every count):
  // whatever it answers, the result holds at most the budget and every carried page it can.
  index::IndexQuery q;
  q.first_candidate = 2;
  q.end_candidate = 40;
  q.budget_pages = 8;
  const std::uint32_t carried[] = {30, 5, 1, 17};  // page 1 is no candidate
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    manager::CarryMerge m;
    REQUIRE(m.start(FocusCarry{.mass = 0.05f, .share = 0.5f}, carried, q));  // up to 4 carried
    std::vector<std::uint32_t> answer;
    int calls = 0;
    do {
      ++calls;
      answer.clear();
      std::vector<std::uint32_t> all;
      for (std::uint32_t p = 2; p < 40; ++p) all.push_back(p);
      std::shuffle(all.begin(), all.end(), rng);
      answer.assign(all.begin(), all.begin() + m.ask());
      std::sort(answer.begin(), answer.end());
    } while (m.take(answer));
    const auto& r = m.result();
    CHECK(calls <= 3);
    CHECK(r.size() <= 8);
    CHECK(std::is_sorted(r.begin(), r.end()));
    for (std::uint32_t p : {30u, 5u, 17u}) CHECK(std::binary_search(r.begin(), r.end(), p));
    CHECK_FALSE(std::binary_search(r.begin(), r.end(), 1u));
  }
  // A nested index (the k lowest pages) gives exactly the budget in at most two calls.
  manager::CarryMerge m;
  REQUIRE(m.start(FocusCarry{.mass = 0.05f, .share = 0.5f}, carried, q));
  int calls = 0;
  std::vector<std::uint32_t> answer;
  do {
    ++calls;
    answer.clear();
    for (std::uint32_t p = 2; p < 2 + static_cast<std::uint32_t>(m.ask()); ++p) answer.push_back(p);
  } while (m.take(answer));
  CHECK(calls == 2);
  CHECK(m.result() == std::vector<std::uint32_t>{2, 3, 4, 5, 6, 7, 17, 30});  // asked 8, then 6
  // Config validation.
  Config c;
  c.shape = {1, 1, 1, 16};
  c.carry.share = 1.0f;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("share"), Error);
  c.carry = FocusCarry{.mass = 0.0f, .share = 0.25f};
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("mass"), Error);
}
