// Core types: 16-bit floats, config validation, page ranges, views, the thread pool, digests.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <limits>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "kvdrive/kvdrive.hpp"
#include "support.hpp"

using namespace kvdrive;

namespace {

double half_value(std::uint16_t h) {  // independent decoding by the formula
  const int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double sign = s ? -1.0 : 1.0;
  if (e == 0) return sign * std::ldexp(m, -24);
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(1024 + m, e - 25);
}

/// Nearest binary16 to x by search over every finite half, ties to even mantissa.
std::uint16_t nearest_half(float x) {
  static const std::vector<std::pair<double, std::uint16_t>> table = [] {
    std::vector<std::pair<double, std::uint16_t>> t;
    for (std::uint32_t h = 0; h < 0x7c00; ++h) t.emplace_back(half_value(static_cast<std::uint16_t>(h)), static_cast<std::uint16_t>(h));
    return t;
  }();
  const double a = std::fabs(static_cast<double>(x));
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double max_half = 65504.0, beyond = 65536.0;  // the next value if the exponent went on
  if (a >= (max_half + beyond) / 2) return sign | 0x7c00;
  auto it = std::lower_bound(table.begin(), table.end(), std::make_pair(a, std::uint16_t{0}));
  if (it == table.begin()) return sign | it->second;
  auto lo = std::prev(it);
  if (it == table.end()) return sign | lo->second;
  const double dl = a - lo->first, dh = it->first - a;
  if (dl < dh) return sign | lo->second;
  if (dh < dl) return sign | it->second;
  return sign | ((lo->second & 1) ? it->second : lo->second);
}

}  // namespace

TEST_CASE("half: every binary16 value round-trips through float") {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = half_bits_to_float(bits);
    const double expect = half_value(bits);
    if (std::isnan(expect)) {
      CHECK(std::isnan(f));
      CHECK(std::isnan(half_bits_to_float(float_to_half_bits(f))));
    } else {
      CHECK(static_cast<double>(f) == expect);
      CHECK(float_to_half_bits(f) == bits);
    }
  }
}

TEST_CASE("half: float to half rounds to nearest even (vs exhaustive search)") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    // Random floats around the half range: exponents from subnormal to overflow.
    std::uint32_t u = bits(rng);
    const std::uint32_t exponent = 100 + (u % 50);  // 2^-27 .. 2^22
    u = (u & 0x807fffffu) | (exponent << 23);
    float f;
    std::memcpy(&f, &u, 4);
    REQUIRE(float_to_half_bits(f) == nearest_half(f));
    ++checked;
  }
  // Exact ties: halfway between neighbours, normal and subnormal, and at the overflow edge.
  for (std::uint16_t h :
       {std::uint16_t{0x3c00}, std::uint16_t{0x3c01}, std::uint16_t{0x0001}, std::uint16_t{0x0002}, std::uint16_t{0x7bfe}, std::uint16_t{0x7bff}}) {
    const double mid = (half_value(h) + half_value(static_cast<std::uint16_t>(h + 1))) / 2;
    const auto f = static_cast<float>(mid);
    REQUIRE(static_cast<double>(f) == mid);
    CHECK(float_to_half_bits(f) == nearest_half(f));
    CHECK(float_to_half_bits(f) == ((h & 1) ? h + 1 : h));
  }
  CHECK(float_to_half_bits(65519.0f) == 0x7bff);
  CHECK(float_to_half_bits(65520.0f) == 0x7c00);
  CHECK(float_to_half_bits(std::ldexp(1.0f, -25)) == 0x0000);  // tie to even zero
  CHECK(float_to_half_bits(std::ldexp(1.5f, -25)) == 0x0001);  // above the tie
  CHECK(float_to_half_bits(-INFINITY) == 0xfc00);
  CHECK(float_to_half_bits(1e-45f) == 0x0000);  // float subnormal
  CHECK(std::isnan(half_bits_to_float(float_to_half_bits(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(half_bits_to_float(float_to_half_bits(std::numeric_limits<float>::signaling_NaN()))));
  CHECK(checked > 0);
}

TEST_CASE("bfloat16: round to nearest even, NaN, Inf and subnormals") {
  auto reference = [](float f) -> std::uint16_t {  // nearest of the two truncation neighbours
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    const std::uint32_t lo = u & 0xffff0000u;
    const std::uint32_t hi = lo + 0x10000u;
    float flo, fhi;
    std::memcpy(&flo, &lo, 4);
    std::memcpy(&fhi, &hi, 4);
    const double dl = std::fabs(static_cast<double>(f) - flo);
    const double dh = (hi & 0x7f800000u) == 0x7f800000u && (hi & 0x7fffffu) == 0 ? std::fabs(std::ldexp(1.0, 128) - std::fabs(static_cast<double>(f)))
                                                                                 : std::fabs(static_cast<double>(fhi) - f);
    if (dl < dh) return static_cast<std::uint16_t>(lo >> 16);
    if (dh < dl) return static_cast<std::uint16_t>(hi >> 16);
    return static_cast<std::uint16_t>(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
  };
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t u = bits(rng);
    if ((u & 0x7f800000u) == 0x7f800000u) continue;  // NaN/Inf checked below
    float f;
    std::memcpy(&f, &u, 4);
    REQUIRE(float_to_bf16_bits(f) == reference(f));
  }
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {  // every bf16 round-trips
    const float f = bf16_bits_to_float(static_cast<std::uint16_t>(b));
    if (std::isnan(f)) CHECK(std::isnan(bf16_bits_to_float(float_to_bf16_bits(f))));
    else CHECK(float_to_bf16_bits(f) == b);
  }
  CHECK(float_to_bf16_bits(INFINITY) == 0x7f80);
  CHECK(float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);  // rounds up to Inf
  CHECK(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(float_to_bf16_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(static_cast<float>(bfloat16(1.0f)) == 1.0f);
  CHECK(static_cast<float>(half(-2.5f)) == -2.5f);
}

TEST_CASE("config: bad input is rejected when the config is built") {
  CHECK_THROWS_WITH_AS(Budget::fraction(0.0), doctest::Contains("outside (0, 1]"), Error);
  CHECK_THROWS_WITH_AS(Budget::fraction(1.5), doctest::Contains("outside (0, 1]"), Error);
  CHECK_THROWS_WITH_AS(Budget::fraction(-0.1), doctest::Contains("outside (0, 1]"), Error);
  CHECK_THROWS_AS(Budget::fraction(std::nan("")), Error);
  CHECK_THROWS_WITH_AS(Budget::pages(0), doctest::Contains("expected >= 1"), Error);
  CHECK_NOTHROW(Budget::fraction(1.0));

  Config c;
  c.shape = {2, 0, 2, 64};
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("zero heads"), Error);
  c.shape = {2, 8, 0, 64};
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("zero heads"), Error);
  c.shape = {2, 8, 3, 64};
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("not a multiple"), Error);
  c.shape = {2, 8, 2, 64};
  c.page_tokens = 0;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("page_tokens"), Error);
}

TEST_CASE("budget: fraction rounds up, clamps, and counts") {
  CHECK(Budget::fraction(0.0625).pages_for(100) == 7);
  CHECK(Budget::fraction(0.0625).pages_for(16) == 1);
  CHECK(Budget::fraction(0.1).pages_for(30) == 3);  // 0.1 x 30 is 3 in exact arithmetic
  CHECK(Budget::fraction(0.01).pages_for(5) == 1);
  CHECK(Budget::fraction(1.0).pages_for(9) == 9);
  CHECK(Budget::pages(5).pages_for(3) == 3);
  CHECK(Budget::pages(5).pages_for(50) == 5);
  CHECK(Budget::pages(5).pages_for(0) == 0);
}

TEST_CASE("page ranges: sink, candidates and local split every page exactly once") {
  for (int pt = 1; pt <= 9; ++pt)
    for (int sink = 0; sink <= 9; sink += 3)
      for (int local = 0; local <= 40; local += 7)
        for (int n = 1; n <= 120; ++n) {
          const PageRanges r = page_ranges(n, pt, sink, local);
          REQUIRE(r.pages == (n + pt - 1) / pt);
          REQUIRE(0 <= r.sink_end);
          REQUIRE(r.sink_end <= r.local_begin);
          REQUIRE(r.local_begin <= r.pages);  // the tail page is local, or sink when both
          for (int p = 0; p < r.pages; ++p) {
            // Independent classification of page p from its first and last token.
            const int first = p * pt, last = std::min(n, (p + 1) * pt) - 1;
            const bool sink_page = first < sink;
            const bool local_page = !sink_page && (last >= n - local || last == n - 1);
            const bool candidate = !sink_page && !local_page;
            REQUIRE((p < r.sink_end) == sink_page);
            REQUIRE((p >= r.sink_end && p < r.local_begin) == candidate);
            REQUIRE((p >= r.local_begin) == local_page);
            if (candidate) REQUIRE(last - first + 1 == pt);  // candidates are sealed pages
          }
        }
}

TEST_CASE("view: row-major strides and element access") {
  std::vector<float> a(2 * 3 * 4);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  auto v = make_view(a, 2, 3, 4);
  CHECK(v.strides[0] == 12);
  CHECK(v.strides[1] == 4);
  CHECK(v.strides[2] == 1);
  CHECK(v(1, 2, 3) == 23.0f);
  CHECK(v.row(1, 1)[2] == 18.0f);
}

TEST_CASE("thread pool: every index runs once; exceptions reach the caller") {
  for (unsigned threads : {1u, 2u, 4u}) {
    ThreadPool pool(threads);
    CHECK(pool.threads() == threads);
    for (int round = 0; round < 20; ++round) {
      std::vector<std::atomic<int>> hits(257);
      pool.parallel_for(hits.size(), [&](std::size_t i) { hits[i].fetch_add(1); });
      for (auto& h : hits) REQUIRE(h.load() == 1);
    }
    CHECK_THROWS_WITH_AS(pool.parallel_for(100,
                                           [](std::size_t i) {
                                             if (i == 37) fail("boom at {}", i);
                                           }),
                         "boom at 37", Error);
    std::atomic<int> after{0};
    pool.parallel_for(10, [&](std::size_t) { after.fetch_add(1); });  // still usable
    CHECK(after.load() == 10);
  }
}

TEST_CASE("thread pool: jobs meet the barrier whether the workers spin or sleep between them") {
  using std::chrono::microseconds;
  for (const microseconds spin : {microseconds{0}, microseconds{50}, ThreadPool::kDefaultSpin}) {
    ThreadPool pool(2, spin);
    CHECK(pool.spin() == (std::thread::hardware_concurrency() >= 2 ? spin : microseconds{0}));
    std::vector<std::int64_t> out(64);
    for (int round = 0; round < 400; ++round) {
      const std::size_t n = 2 + static_cast<std::size_t>(round % 63);
      pool.parallel_for(n, [&](std::size_t i) { out[i] = round * 1000 + static_cast<std::int64_t>(i); });
      for (std::size_t i = 0; i < n; ++i) REQUIRE(out[i] == round * 1000 + static_cast<std::int64_t>(i));
      // Now and then a gap longer than the spin, so the workers (and the caller) go to sleep.
      if (round % 50 == 0) std::this_thread::sleep_for(spin + microseconds{300});
    }
  }
}

/// CPU time of the whole process, in milliseconds.
static double process_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

TEST_CASE("thread pool: an idle pool sleeps instead of spinning") {
  ThreadPool pool(2, std::chrono::microseconds{1000});
  std::atomic<int> ran{0};
  pool.parallel_for(8, [&](std::size_t) { ran.fetch_add(1); });
  CHECK(ran.load() == 8);
  const double before = process_cpu_ms();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // A worker that kept polling would burn ~200 ms of CPU here; one that sleeps after its 1 ms
  // of polling burns about 1 ms (the margin covers sanitizers and a loaded machine).
  CHECK(process_cpu_ms() - before < 60.0);
}

TEST_CASE("backend::Cpu on a shared pool: that pool's threads, every index once") {
  ThreadPool pool(2);
  backend::Cpu shared(pool), own({3});
  CHECK(shared.threads() == 2);
  CHECK(own.threads() == 3);
  std::vector<int> hits(100, 0);
  shared.parallel_for(hits.size(), [&](std::size_t i) { hits[i] += 1; });
  pool.parallel_for(hits.size(), [&](std::size_t i) { hits[i] += 1; });
  CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 2; }));
}

TEST_CASE("prefix digest: equal prefixes agree, different ones differ") {
  const std::vector<std::int32_t> a{1, 2, 3, 4}, b{1, 2, 3, 5};
  CHECK(PrefixDigest::of_tokens(a) == PrefixDigest::of_tokens(std::vector<std::int32_t>{1, 2, 3, 4}));
  CHECK_FALSE(PrefixDigest::of_tokens(a) == PrefixDigest::of_tokens(b));
  CHECK(PrefixDigest::of_tokens(a).hex().size() == 32);
  CHECK(PrefixDigest::of_tokens(a) == PrefixDigest::of_bytes(a.data(), a.size() * 4, 4));
  CHECK(PrefixDigest::of_tokens(a).tokens == 4);
}
