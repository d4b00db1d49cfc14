// Cold-page codecs (codec/): the coded layout's sizes; the codes the encoder writes checked
// against a double-precision reading of the format (each group's codes bracket its minimum and
// maximum by at most one unit, each value code is a nearest level); every decoded value within
// half a step of its input, the step bounded from the block's and group's true ranges;
// decode_page (AVX2) equal to decode_page_portable bit for bit; a test-only decoder written from
// the format's description agreeing with both; nibble order, constant blocks, non-finite input
// and bad layouts.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kvdrive/codec/cpu_codec.hpp"

using namespace kvdrive;
using codec::Codec;
using codec::CodedLayout;
using codec::PageCodec;

namespace {

/// A uniform float in [-1, 1) from the generator's raw bits (no <random> distributions: every
/// platform draws the same values).
float unit_float(std::mt19937& rng) { return static_cast<float>(rng() >> 8) / 8388608.0f - 1.0f; }

/// A page of `tokens` x `head_dim` keys then values that looks like a model's: keys with a
/// per-channel scale (two outlier channels ten times the rest) and offset, values per token.
template <class T>
std::vector<T> model_like_page(int tokens, int head_dim, std::mt19937& rng) {
  std::vector<T> page(2 * static_cast<std::size_t>(tokens) * head_dim);
  std::vector<float> scale(head_dim), offset(head_dim);
  for (int c = 0; c < head_dim; ++c) {
    scale[c] = (c == 3 || c == head_dim - 5 ? 10.0f : 1.0f) * (0.5f + 0.5f * std::fabs(unit_float(rng)));
    offset[c] = 2.0f * unit_float(rng);
  }
  for (int t = 0; t < tokens; ++t)
    for (int c = 0; c < head_dim; ++c) {
      const std::size_t i = static_cast<std::size_t>(t) * head_dim + c;
      page[i] = from_float<T>(offset[c] + scale[c] * unit_float(rng));
      page[static_cast<std::size_t>(tokens) * head_dim + i] = from_float<T>(0.3f * unit_float(rng) + 0.05f * static_cast<float>(t));
    }
  return page;
}

/// The format, read independently of the library (in double): the header's floats and a group's
/// codes, and value code i of a block.
struct Reading {
  const std::uint8_t* coded;
  const CodedLayout& l;

  double header(int i) const {
    float f;
    std::memcpy(&f, coded + 4 * i, 4);
    return f;
  }
  unsigned key_code(unsigned channel, int which) const { return coded[16 + 2 * channel + which]; }
  unsigned value_code(unsigned token, int which) const { return coded[16 + 2 * l.head_dim + 2 * token + which]; }
  unsigned code(bool value_block, std::size_t i) const {
    const std::size_t data = 16 + 2 * l.head_dim + 2 * l.tokens + (value_block ? l.data_bytes : 0);
    if (l.bits == 8) return coded[data + i];
    const unsigned byte = coded[data + i / 2];
    return i % 2 == 0 ? byte & 15u : byte >> 4;
  }
};

/// Checks one block of a coded page against its input, in double: the block range, each group's
/// codes, each value code and each decoded value.
template <class T>
void check_block(const T* in, const T* out, const Reading& r, bool value_block) {
  const CodedLayout& l = r.l;
  const unsigned groups = value_block ? l.tokens : l.head_dim;  // keys per channel, values per token
  auto group = [&](unsigned t, unsigned c) { return value_block ? t : c; };
  std::vector<double> gmin(groups, 1e300), gmax(groups, -1e300);
  double lo = 1e300, hi = -1e300;
  for (unsigned t = 0; t < l.tokens; ++t)
    for (unsigned c = 0; c < l.head_dim; ++c) {
      const double x = to_float(in[t * l.head_dim + c]);
      const unsigned g = group(t, c);
      gmin[g] = std::min(gmin[g], x), gmax[g] = std::max(gmax[g], x);
      lo = std::min(lo, x), hi = std::max(hi, x);
    }
  const double block_lo = r.header(value_block ? 2 : 0), unit = r.header(value_block ? 3 : 1);
  CHECK(block_lo == lo);
  CHECK(unit == doctest::Approx((hi - lo) / 255).epsilon(1e-6));
  for (unsigned g = 0; g < groups; ++g) {
    const unsigned m = value_block ? r.value_code(g, 0) : r.key_code(g, 0);
    const unsigned big = value_block ? r.value_code(g, 1) : r.key_code(g, 1);
    const double slack = 1e-5 * (std::fabs(lo) + std::fabs(hi)) + 1e-30;
    if (unit > 0) {  // the codes bracket the group, by at most one unit each side
      CHECK(lo + m * unit <= gmin[g] + slack);
      CHECK(lo + (m + 1) * unit > gmin[g] - slack);
      CHECK(lo + big * unit >= gmax[g] - slack);
      CHECK((big == 0 || lo + (big - 1) * unit < gmax[g] + slack));
    }
    const double glo = lo + m * unit, step = (static_cast<double>(big) - m) * unit / l.levels;
    // The step is bounded by the group's own range plus two units: never the block's range.
    CHECK(step <= (gmax[g] - gmin[g] + 2 * unit) / l.levels * (1 + 1e-5) + slack);
    for (unsigned t = 0; t < l.tokens; ++t)
      for (unsigned c = 0; c < l.head_dim; ++c) {
        if (group(t, c) != g) continue;
        const std::size_t i = static_cast<std::size_t>(t) * l.head_dim + c;
        const double x = to_float(in[i]);
        const unsigned q = r.code(value_block, i);
        REQUIRE(q <= l.levels);
        const double level = glo + q * step;
        // A nearest level (the clamp at the range's ends aside, where the level is the end).
        if (step > 0) CHECK(std::fabs(x - level) <= step * (0.5 + 1e-4) + slack);
        const double got = to_float(out[i]);
        // The decoded value is that level, rounded once to float and once to the dtype.
        const double dtype_ulp = sizeof(T) == 4 ? 0 : std::fabs(level) * (std::is_same_v<T, half> ? 1.0 / 1024 : 1.0 / 128);
        const double rounding = 1e-6 * (std::fabs(level) + std::fabs(lo) + std::fabs(hi)) + dtype_ulp + 1e-30;
        CHECK(std::fabs(got - level) <= rounding);
        // So the decoded value is within half a step of the input, and the step is the group's.
        CHECK(std::fabs(got - x) <= step * (0.5 + 1e-4) + slack + rounding);
      }
  }
}

template <class T>
void round_trip(PageCodec pc, int tokens, int head_dim, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const CodedLayout l = CodedLayout::make(tokens, head_dim, pc);
  const auto page = model_like_page<T>(tokens, head_dim, rng);
  std::vector<std::uint8_t> coded(l.bytes + 3, 0xAB);
  codec::encode_page(l, page.data(), coded.data());
  CHECK(coded[l.bytes] == 0xAB);  // nothing past the coded page
  std::vector<T> fast(page.size()), portable(page.size());
  codec::decode_page(l, coded.data(), fast.data());
  codec::decode_page_portable(l, coded.data(), portable.data());
  CHECK(std::memcmp(fast.data(), portable.data(), fast.size() * sizeof(T)) == 0);
  const Reading r{coded.data(), l};
  const std::size_t n = static_cast<std::size_t>(tokens) * head_dim;
  check_block(page.data(), fast.data(), r, false);
  check_block(page.data() + n, fast.data() + n, r, true);
}

}  // namespace

TEST_CASE("CodedLayout: SmolLM2's page (8 tokens x 64, f16: 2,048 bytes) in each codec") {
  CHECK(CodedLayout::make(8, 64, {Codec::int8}).bytes == 1184);
  CHECK(CodedLayout::make(8, 64, {Codec::int4}).bytes == 672);
  CHECK(CodedLayout::make(16, 64, {Codec::int4}).bytes == 1200);
  CHECK(CodedLayout::make(16, 128, {Codec::int4}).bytes == 16 + 256 + 32 + 2048);
  CHECK_THROWS_WITH_AS(CodedLayout::make(8, 63, {Codec::int4}), doctest::Contains("even"), Error);
  CHECK_THROWS_WITH_AS(CodedLayout::make(8, 64, {}), doctest::Contains("none"), Error);
  CHECK_THROWS_WITH_AS(CodedLayout::make(0, 64, {Codec::int8}), doctest::Contains("tokens"), Error);
  CHECK(codec::parse_codec("int4") == Codec::int4);
  CHECK_THROWS_WITH_AS(codec::parse_codec("int3"), doctest::Contains("int8 or int4"), Error);
  CHECK(PageCodec{Codec::int4}.name() == "int4");
}

TEST_CASE("encode_page/decode_page: codes checked against the format in double, values within half a step, AVX2 = portable") {
  std::uint32_t seed = 1;
  for (Codec c : {Codec::int8, Codec::int4})
    for (auto [tokens, head_dim] : {std::pair{8, 64}, std::pair{16, 128}, std::pair{3, 10}, std::pair{1, 2}}) {
      CAPTURE(codec::codec_name(c));
      CAPTURE(tokens);
      CAPTURE(head_dim);
      for (int repeat = 0; repeat < 3; ++repeat) {
        round_trip<float>({c}, tokens, head_dim, seed++);
        round_trip<half>({c}, tokens, head_dim, seed++);
        round_trip<bfloat16>({c}, tokens, head_dim, seed++);
      }
    }
}

TEST_CASE("encode_page: keys per channel keep a small channel precise beside an outlier channel") {
  // Channel 0 spans [-8, 8], channel 1 spans [-0.1, 0.1]: in INT4 channel 1's error stays
  // within its own range's step (0.2 / 15 / 2 plus the codes' unit), far below the outlier's.
  const int tokens = 8, head_dim = 8;
  std::vector<float> page(2 * tokens * head_dim, 0.0f);
  std::mt19937 rng(7);
  for (int t = 0; t < tokens; ++t) {
    page[t * head_dim + 0] = 8.0f * unit_float(rng);
    page[t * head_dim + 1] = 0.1f * unit_float(rng);
  }
  page[0] = -8.0f, page[head_dim] = 8.0f;  // the outlier spans its whole range
  const CodedLayout l = CodedLayout::make(tokens, head_dim, {Codec::int4});
  std::vector<std::uint8_t> coded(l.bytes);
  codec::encode_page(l, page.data(), coded.data());
  std::vector<float> out(page.size());
  codec::decode_page(l, coded.data(), out.data());
  const double unit = 16.0 / 255;
  for (int t = 0; t < tokens; ++t) {
    CHECK(std::fabs(out[t * head_dim + 1] - page[t * head_dim + 1]) <= (0.2 + 2 * unit) / 15 / 2 + 1e-6);
    CHECK(std::fabs(out[t * head_dim + 0] - page[t * head_dim + 0]) <= (16.0 + 2 * unit) / 15 / 2 + 1e-6);
  }
}

TEST_CASE("encode_page: INT4 value codes pack two to a byte, the even value in the low nibble") {
  // Keys: channel 0 of token t is t (rising), channel 1 is 15 - t (falling); one block range 0..15.
  const int tokens = 8, head_dim = 2;
  std::vector<float> page(2 * tokens * head_dim, 1.0f);
  for (int t = 0; t < tokens; ++t) page[t * 2] = static_cast<float>(t), page[t * 2 + 1] = static_cast<float>(15 - t);
  const CodedLayout l = CodedLayout::make(tokens, head_dim, {Codec::int4});
  std::vector<std::uint8_t> coded(l.bytes);
  codec::encode_page(l, page.data(), coded.data());
  // Each channel's ends are its group's ends: codes 0 and 15.
  CHECK(coded[l.key_data + 0] == 0xF0);  // token 0: channel 0 at its minimum (low nibble), channel 1 at its maximum
  CHECK(coded[l.key_data + 7] == 0x0F);
  for (int t = 1; t < tokens; ++t) {
    CHECK((coded[l.key_data + t] & 15) >= (coded[l.key_data + t - 1] & 15));
    CHECK((coded[l.key_data + t] >> 4) <= (coded[l.key_data + t - 1] >> 4));
  }
  // The V block is constant: its range has no width, every code is 0, and it decodes exactly.
  std::vector<float> out(page.size());
  codec::decode_page(l, coded.data(), out.data());
  for (int i = 0; i < tokens * head_dim; ++i) CHECK(out[tokens * head_dim + i] == 1.0f);
  const Reading r{coded.data(), l};
  CHECK(r.header(3) == 0.0);
  CHECK(out[0] == 0.0f);
  CHECK(out[1] == doctest::Approx(15.0).epsilon(1e-5));
}

TEST_CASE("encode_page: NaN and infinities in a page are coded as finite values, never undefined behaviour") {
  const int tokens = 8, head_dim = 8;
  std::mt19937 rng(3);
  auto page = model_like_page<float>(tokens, head_dim, rng);
  page[5] = std::numeric_limits<float>::quiet_NaN();
  page[9] = std::numeric_limits<float>::infinity();
  page[tokens * head_dim + 2] = -std::numeric_limits<float>::infinity();
  for (Codec c : {Codec::int8, Codec::int4}) {
    const CodedLayout l = CodedLayout::make(tokens, head_dim, {c});
    std::vector<std::uint8_t> coded(l.bytes);
    codec::encode_page(l, page.data(), coded.data());
    std::vector<float> out(page.size()), portable(page.size());
    codec::decode_page(l, coded.data(), out.data());
    codec::decode_page_portable(l, coded.data(), portable.data());
    CHECK(std::memcmp(out.data(), portable.data(), out.size() * 4) == 0);
    for (float x : out) CHECK(std::isfinite(x));
    CHECK(out[9] == doctest::Approx(codec::kValueCap).epsilon(1e-3));  // +inf reads as the cap
  }
}
