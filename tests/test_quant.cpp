// GGUF block formats (examples/llama3/kernels/quant.hpp) and the projections computed from them
// (quant_dot.hpp, linear.hpp):
//   - dequantize_row equals gguf-py's gguf.quants.dequantize bit for bit on the committed golden
//     blocks (tests/data/quant/<TYPE>.json, written by scripts/make-quant-golden.py: the blocks in
//     hex, the reference floats as the hex of their bits), for all 11 types;
//   - types without kernels and partial blocks are errors;
//   - activation quantization is within half a step of the input;
//   - each block kernel's row dot against a double-precision dot of the dequantized weights with
//     the quantized-then-dequantized activations (tight: 1e-5 of sum |w x~|) and with the float
//     activations (the quantization bound sum_b d_b / 2 * sum_(j in b) |w_j|, plus the tight part);
//   - matvec/matmul for every type equal the row dot, bit for bit for any thread count (1, 2, 3),
//     and matmul's row i equals matvec of input i;
//   - a hash of products over all types that the AVX2 and the portable (KVD_DISABLE_SIMD) builds
//     both reproduce: the two paths give the same floats bit for bit.
// Data come from a fixed integer generator (no <random> distributions), so every build and
// platform computes on the same bits.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/linear.hpp"
#include "model_files.hpp"
#include "kernels/quant.hpp"
#include "kernels/quant_dot.hpp"

using namespace kvdrive;
using namespace kvdrive::llama;

namespace {

struct Rng {
  std::uint64_t s;
  std::uint64_t next() {  // splitmix64
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  int in(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<std::uint64_t>(hi - lo + 1)); }
  /// A float of a few significant bits in about [-scale, scale].
  float value(float scale) { return static_cast<float>(in(-1000, 1000)) * (scale / 1000.0f); }
};

constexpr GgmlType kAll[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                             GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }
std::int64_t block_of(GgmlType t) { return ggml_type_traits(t).block_elems; }

void put_half(std::byte* p, float f) {
  const std::uint16_t h = float_to_half_bits(f);
  std::memcpy(p, &h, 2);
}

/// A rows x cols matrix of type t: random bytes for the quantized values and packed scales,
/// realistic fp16 block scales (|d| in ~[1e-3, 5e-2], minimums ~ -8 d), small floats for F32/F16/BF16.
std::vector<std::byte> random_matrix(GgmlType t, std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  Rng rng{seed};
  const std::size_t bytes = ggml_row_bytes(t, cols) * static_cast<std::size_t>(rows);
  std::vector<std::byte> m(bytes);
  for (auto& b : m) b = static_cast<std::byte>(rng.next() & 0xFF);
  const std::int64_t n = rows * cols;
  auto scale = [&] { return (1.0f + static_cast<float>(rng.in(0, 49))) * 1e-3f; };
  auto sign = [&] { return rng.in(0, 1) ? 1.0f : -1.0f; };
  const GgmlTypeTraits tr = ggml_type_traits(t);
  const std::int64_t blocks = n / tr.block_elems;
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::byte* p = m.data() + b * tr.block_bytes;
    switch (t) {
      case GgmlType::F32: {
        const float f = rng.value(1.0f);
        std::memcpy(p, &f, 4);
        break;
      }
      case GgmlType::F16: {
        put_half(p, rng.value(1.0f));
        break;
      }
      case GgmlType::BF16: {
        const std::uint16_t h = float_to_bf16_bits(rng.value(1.0f));
        std::memcpy(p, &h, 2);
        break;
      }
      case GgmlType::Q4_0:
      case GgmlType::Q5_0:
      case GgmlType::Q8_0: put_half(p, sign() * scale()); break;
      case GgmlType::Q4_1:
      case GgmlType::Q5_1: {
        const float d = scale();
        put_half(p, d);
        put_half(p + 2, -8.0f * d * (0.5f + static_cast<float>(rng.in(0, 100)) / 100.0f));
        break;
      }
      case GgmlType::Q4_K:
      case GgmlType::Q5_K:
        put_half(p, scale() * 0.1f);
        put_half(p + 2, scale() * 0.1f);
        break;
      case GgmlType::Q6_K: put_half(p + 208, scale() * 0.05f); break;
      default: break;
    }
  }
  return m;
}

std::vector<float> random_acts(std::size_t n, std::int64_t cols, std::uint64_t seed) {
  Rng rng{seed};
  std::vector<float> x(n * static_cast<std::size_t>(cols));
  for (auto& v : x) v = rng.value(2.0f);
  for (std::size_t i = 0; i < n; ++i)  // an outlier per row, as in real activations
    x[i * static_cast<std::size_t>(cols) + static_cast<std::size_t>(rng.in(0, static_cast<int>(cols) - 1))] = 40.0f;
  return x;
}

std::vector<float> dequantized(const Matrix& w) {
  std::vector<float> v(static_cast<std::size_t>(w.rows * w.cols));
  for (std::int64_t r = 0; r < w.rows; ++r) dequantize_row(w.type, w.row(r), v.data() + r * w.cols, w.cols);
  return v;
}

struct Golden {
  GgmlType type{};
  std::int64_t elems = 0;
  std::vector<std::byte> blocks;
  std::vector<float> values;
};

/// The value of hex digits (at most 8), or nullopt if they are not all hex digits.
std::optional<std::uint32_t> hex_value(std::string_view hex) {
  std::uint32_t v = 0;
  for (const char c : hex) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = v << 4 | static_cast<std::uint32_t>(d);
  }
  return v;
}

/// A golden file: the blocks and gguf-py's floats for them, row by row (a row is a block, or
/// 32 elements of a float type), as hex of the bytes and of the floats' bits.
Golden read_golden(GgmlType t) {
  const auto path = test::test_data("quant/" + ggml_type_name(t) + ".json");
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.good(), "missing golden file " << path.string() << " (scripts/make-quant-golden.py)");
  const nlohmann::json j = nlohmann::json::parse(f);
  Golden g;
  g.type = static_cast<GgmlType>(j.at("type_id").get<std::uint32_t>());
  g.elems = j.at("elements").get<std::int64_t>();
  REQUIRE(j.at("type").get<std::string>() == ggml_type_name(t));
  REQUIRE(g.type == t);
  const std::int64_t block_bytes = ggml_type_traits(t).block_bytes;
  REQUIRE(j.at("block_elements").get<std::int64_t>() == block_of(t));
  REQUIRE(j.at("block_bytes").get<std::int64_t>() == block_bytes);
  bool well_formed = true;
  for (const nlohmann::json& row : j.at("rows")) {
    const std::string bytes = row.at("bytes").get<std::string>();
    const nlohmann::json& values = row.at("values");
    well_formed = well_formed && bytes.size() % (2 * static_cast<std::size_t>(block_bytes)) == 0 &&
                  values.size() == bytes.size() / 2 / static_cast<std::size_t>(block_bytes) * static_cast<std::size_t>(block_of(t));
    for (std::size_t i = 0; i + 1 < bytes.size(); i += 2) {
      const std::optional<std::uint32_t> b = hex_value(std::string_view(bytes).substr(i, 2));
      well_formed = well_formed && b.has_value();
      g.blocks.push_back(static_cast<std::byte>(b.value_or(0)));
    }
    for (const nlohmann::json& v : values) {  // a float's bits, 8 hex digits
      const std::string hex = v.get<std::string>();
      const std::optional<std::uint32_t> bits = hex_value(hex);
      well_formed = well_formed && hex.size() == 8 && bits.has_value();
      g.values.push_back(std::bit_cast<float>(bits.value_or(0)));
    }
  }
  REQUIRE_MESSAGE(well_formed, path.string() << ": a row is not whole blocks of hex with a float (8 hex digits) per element");
  REQUIRE(g.values.size() == static_cast<std::size_t>(g.elems));
  REQUIRE(g.blocks.size() == ggml_row_bytes(t, g.elems));
  return g;
}

std::uint32_t bits_of(float f) { return float_bits(f); }

}  // namespace

TEST_CASE("dequantize_row equals gguf-py's dequantize bit for bit") {
  for (GgmlType t : kAll) {
    CAPTURE(ggml_type_name(t));
    const Golden g = read_golden(t);
    std::vector<float> out(static_cast<std::size_t>(g.elems), -1.0f);
    dequantize_row(t, g.blocks.data(), out.data(), g.elems);
    int mismatches = 0;
    for (std::int64_t i = 0; i < g.elems; ++i)
      if (bits_of(out[i]) != bits_of(g.values[i])) {
        if (++mismatches <= 5) MESSAGE("value " << i << ": " << out[i] << " vs reference " << g.values[i]);
      }
    CHECK(mismatches == 0);
    // Block by block gives the same values.
    const std::int64_t be = block_of(t);
    const std::size_t bb = static_cast<std::size_t>(ggml_type_traits(t).block_bytes);
    std::vector<float> one(static_cast<std::size_t>(be));
    bool same = true;
    for (std::int64_t b = 0; b < g.elems / be; ++b) {
      dequantize_row(t, g.blocks.data() + static_cast<std::size_t>(b) * bb, one.data(), be);
      same = same && std::memcmp(one.data(), out.data() + b * be, one.size() * sizeof(float)) == 0;
    }
    CHECK(same);
  }
}

TEST_CASE("the 6-bit packed scales of Q4_K/Q5_K: bytewise and wordwise") {
  Rng rng{77};
  for (int trial = 0; trial < 300; ++trial) {
    std::byte packed[12];
    for (auto& b : packed) b = static_cast<std::byte>(trial < 2 ? (trial ? 0xFF : 0x00) : rng.next() & 0xFF);
    std::uint8_t sc[8], m[8];
    quant::scale_min_k4(quant::bytes(packed), sc, m);
    std::uint64_t sc_words, m_words;
    quant::scale_min_k4_words(packed, sc_words, m_words);
    for (int j = 0; j < 8; ++j) {
      CHECK(sc[j] == ((sc_words >> (8 * j)) & 0xFF));
      CHECK(m[j] == ((m_words >> (8 * j)) & 0xFF));
      CHECK(sc[j] < 64);
      CHECK(m[j] < 64);
    }
  }
}

TEST_CASE("types without kernels and partial blocks are errors") {
  std::vector<std::byte> buf(4096);
  std::vector<float> out(1024);
  for (GgmlType t :
       {GgmlType::Q8_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q8_K, GgmlType::IQ4_NL, GgmlType::I8, GgmlType::F64, GgmlType::MXFP4}) {
    CAPTURE(ggml_type_name(t));
    CHECK_THROWS_AS(dequantize_row(t, buf.data(), out.data(), 256), Error);
    ThreadPool pool(1);
    const Matrix w{buf.data(), t, 2, 256};
    CHECK_THROWS_AS(matvec(pool, w, out.data(), out.data() + 512), Error);
    CHECK_THROWS_AS(matmul(pool, w, out.data(), out.data() + 512, 1), Error);
  }
  CHECK_THROWS_AS(dequantize_row(GgmlType::Q4_0, buf.data(), out.data(), 48), Error);
  CHECK_THROWS_AS(dequantize_row(GgmlType::Q4_K, buf.data(), out.data(), 128), Error);
  CHECK_THROWS_AS(dequantize_row(static_cast<GgmlType>(77), buf.data(), out.data(), 32), Error);
  const Matrix table{buf.data(), GgmlType::Q8_0, 4, 64};
  CHECK_THROWS_AS(embed_row(table, 4, out.data()), Error);
  CHECK_THROWS_AS(embed_row(table, -1, out.data()), Error);
}

TEST_CASE("embed_row dequantizes one row of the table") {
  for (GgmlType t : kAll) {
    CAPTURE(ggml_type_name(t));
    const std::int64_t cols = 512;
    const auto data = random_matrix(t, 5, cols, 7);
    const Matrix w{data.data(), t, 5, cols};
    std::vector<float> a(cols), b(cols);
    ThreadPool pool(1);
    CpuLinear lin(pool);
    lin.embed_row(w, 3, a.data());
    dequantize_row(t, w.row(3), b.data(), cols);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("activation quantization is within half a step") {
  for (quant::ActFormat f : {quant::ActFormat::Q16x32, quant::ActFormat::Q8x256}) {
    const bool q16 = f == quant::ActFormat::Q16x32;
    const int qmax_want = q16 ? 32767 : 127;
    const std::int64_t cols = 768;
    auto x = random_acts(3, cols, 11);
    for (std::int64_t j = 256; j < 512; ++j) x[static_cast<std::size_t>(j)] = 0.0f;  // an all-zero block: d = 0
    quant::QuantizedActs acts;
    acts.quantize(f, x.data(), 3, cols);
    const int blk = quant::act_block(f);
    for (std::size_t i = 0; i < 3; ++i) {
      const quant::ActRow r = acts.row(i);
      auto q = [&](std::int64_t j) { return q16 ? static_cast<int>(r.q16[j]) : static_cast<int>(r.q[j]); };
      std::vector<float> back(static_cast<std::size_t>(cols));
      acts.dequantize(i, back.data());
      for (std::int64_t b = 0; b < cols / blk; ++b) {
        float amax = 0;
        for (int k = 0; k < blk; ++k) amax = std::max(amax, std::fabs(x[i * cols + static_cast<std::size_t>(b * blk + k)]));
        CHECK(r.scale(b) == amax / static_cast<float>(qmax_want));
        int qmax = 0;
        for (int k = 0; k < blk; ++k) {
          const std::size_t j = i * cols + static_cast<std::size_t>(b * blk + k);
          qmax = std::max(qmax, std::abs(q(b * blk + k)));
          CHECK(std::fabs(back[static_cast<std::size_t>(b * blk + k)] - x[j]) <= 0.5001f * r.scale(b));
        }
        CHECK(qmax == (amax > 0 ? qmax_want : 0));
        if (q16) {
          int s = 0;
          for (int k = 0; k < blk; ++k) s += q(b * blk + k);
          CHECK(r.d[2 * b + 1] == r.scale(b) * static_cast<float>(s));
        } else
          for (int g = 0; g < 16; ++g) {
            int s = 0;
            for (int k = 0; k < 16; ++k) s += q(b * blk + 16 * g + k);
            CHECK(r.sums16[b * 16 + g] == s);
          }
      }
    }
  }
}

TEST_CASE("row dots against double-precision references") {
  const std::int64_t rows = 9;
  for (GgmlType t : kAll) {
    CAPTURE(ggml_type_name(t));
    const std::vector<std::int64_t> col_counts =
        is_float_type(t) ? std::vector<std::int64_t>{72, 77, 512} : std::vector<std::int64_t>{block_of(t) * 3, 512};
    for (std::int64_t cols : col_counts) {
      CAPTURE(cols);
      const auto data = random_matrix(t, rows, cols, 100 + static_cast<std::uint64_t>(t));
      const Matrix w{data.data(), t, rows, cols};
      const std::vector<float> wf = dequantized(w);
      const auto x = random_acts(1, cols, 200 + static_cast<std::uint64_t>(cols));
      ThreadPool pool(2);
      std::vector<float> y(rows);
      matvec(pool, w, x.data(), y.data());
      if (is_float_type(t)) {  // float activations: only the float sum's rounding
        for (std::int64_t r = 0; r < rows; ++r) {
          double ref = 0, mag = 0;
          for (std::int64_t j = 0; j < cols; ++j) {
            ref += static_cast<double>(wf[r * cols + j]) * x[j];
            mag += std::fabs(static_cast<double>(wf[r * cols + j]) * x[j]);
          }
          CHECK(std::fabs(y[r] - ref) <= 1e-5 * mag + 1e-30);
        }
        continue;
      }
      quant::QuantizedActs acts;
      acts.quantize(quant::act_format(t), x.data(), 1, cols);
      std::vector<float> xq(static_cast<std::size_t>(cols));
      acts.dequantize(0, xq.data());
      const quant::ActRow a = acts.row(0);
      const int blk = quant::act_block(quant::act_format(t));
      double worst_tight = 0;
      for (std::int64_t r = 0; r < rows; ++r) {
        const float dot = quant::row_dot(w, r, a);
        CHECK(bits_of(dot) == bits_of(y[r]));  // matvec is the row dot, bit for bit
        double ref_q = 0, ref_x = 0, mag = 0, bound = 0;
        for (std::int64_t j = 0; j < cols; ++j) {
          const double wj = wf[r * cols + j];
          ref_q += wj * xq[j];
          ref_x += wj * x[j];
          mag += std::fabs(wj * xq[j]);
          bound += std::fabs(wj) * 0.5001 * a.scale(j / blk);
        }
        const double tight = 1e-5 * mag + 1e-30;
        worst_tight = std::max(worst_tight, std::fabs(dot - ref_q) / (mag + 1e-30));
        CHECK(std::fabs(dot - ref_q) <= tight);
        CHECK(std::fabs(dot - ref_x) <= bound + tight);
      }
      MESSAGE(ggml_type_name(t) << " cols " << cols << ": worst |dot - ref| / sum|w x~| = " << worst_tight);
    }
  }
}

TEST_CASE("matvec and matmul: thread counts, tiles, matmul rows equal matvec") {
  // Small products run on the calling thread unless told otherwise: run them on the pool here.
  struct OnPool {
    std::size_t saved = detail::inline_product_bytes();
    OnPool() { detail::inline_product_bytes() = 0; }
    ~OnPool() { detail::inline_product_bytes() = saved; }
  } on_pool;
  for (GgmlType t : kAll) {
    CAPTURE(ggml_type_name(t));
    const std::int64_t rows = 37, cols = is_float_type(t) ? 160 : (block_of(t) == 32 ? 160 : 512);
    const auto data = random_matrix(t, rows, cols, 300 + static_cast<std::uint64_t>(t));
    const Matrix w{data.data(), t, rows, cols};
    for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{9}}) {
      CAPTURE(n);
      const auto x = random_acts(n, cols, 400 + n);
      std::vector<float> first;
      for (unsigned threads : {1u, 2u, 3u}) {
        CAPTURE(threads);
        ThreadPool pool(threads);
        std::vector<float> y(n * rows, -7.0f), yv(n * rows, -9.0f);
        matmul(pool, w, x.data(), y.data(), n);
        for (std::size_t i = 0; i < n; ++i) matvec(pool, w, x.data() + i * cols, yv.data() + i * rows);
        CHECK(std::memcmp(y.data(), yv.data(), y.size() * sizeof(float)) == 0);
        if (first.empty()) first = y;
        else CHECK(std::memcmp(first.data(), y.data(), y.size() * sizeof(float)) == 0);
        if (!is_float_type(t)) {  // and equal to the row dot
          quant::QuantizedActs acts;
          acts.quantize(quant::act_format(t), x.data(), n, cols);
          bool same = true;
          for (std::size_t i = 0; i < n; ++i)
            for (std::int64_t r = 0; r < rows; ++r) same = same && bits_of(quant::row_dot(w, r, acts.row(i))) == bits_of(y[i * rows + r]);
          CHECK(same);
        }
      }
    }
  }
}

TEST_CASE("the float paths: Matrix overloads and CpuLinear agree with the float-pointer ones") {
  const std::int64_t rows = 21, cols = 96;
  const auto data = random_matrix(GgmlType::F32, rows, cols, 5);
  const auto* wf = reinterpret_cast<const float*>(data.data());
  const auto x = random_acts(3, cols, 6);
  ThreadPool pool(2);
  CpuLinear lin(pool);
  std::vector<float> a(3 * rows), b(3 * rows), c(3 * rows);
  lin.matmul(Matrix::f32(wf, rows, cols), x.data(), a.data(), 3);
  lin.matmul(wf, x.data(), b.data(), 3, rows, cols);
  for (int i = 0; i < 3; ++i) lin.matvec(Matrix::f32(wf, rows, cols), x.data() + i * cols, c.data() + i * rows);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)) == 0);
}

TEST_CASE("zero activations give exact zeros") {
  for (GgmlType t : kAll) {
    CAPTURE(ggml_type_name(t));
    const std::int64_t rows = 8, cols = 256;
    const auto data = random_matrix(t, rows, cols, 9);
    const std::vector<float> x(cols, 0.0f);
    std::vector<float> y(rows, 1.0f);
    ThreadPool pool(1);
    matvec(pool, Matrix{data.data(), t, rows, cols}, x.data(), y.data());
    for (float v : y) CHECK(bits_of(v) == 0u);
  }
}

// The products of every type on fixed data, hashed. The AVX2 and the portable build compute the
// same integers and the same fmas in the same order, so both give this hash; it changes only when
// a kernel's summation order (or the activation rounding) is changed on purpose.
/// FNV-1a of the float bits of a 5 x 24 product of type t over `cols` values.
std::uint64_t product_hash(GgmlType t, std::int64_t cols) {
  const std::int64_t rows = 24;
  const auto data = random_matrix(t, rows, cols, 500 + static_cast<std::uint64_t>(t));
  const auto x = random_acts(5, cols, 600);
  std::vector<float> y(5 * rows);
  ThreadPool pool(2);
  matmul(pool, Matrix{data.data(), t, rows, cols}, x.data(), y.data(), 5);
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (float v : y) {
    std::uint32_t u = bits_of(v);
    for (int b = 0; b < 4; ++b, u >>= 8) h = (h ^ (u & 0xFF)) * 0x100000001b3ULL;
  }
  return h;
}

TEST_CASE("the AVX2 and the portable kernels give the same bits") {
  // Products over 512 values, per type (in kAll's order); and over 160 (five blocks: an odd last
  // block, which joins the first of the two accumulation chains) for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
  constexpr std::uint64_t kExpected[] = {0xc0f8fed37b308bd2, 0xb3729bf0c9de4342, 0x3cfbb36746027ef5, 0x2e5d2280feb698bd,
                                         0x5895c4cb23e7cb78, 0x53959e3bade7cbf8, 0xce9df3177c275f6d, 0xe1de38118ec7798b,
                                         0xdb95d684cfacb894, 0xdcfae0b7812989c7, 0xfbf033d4f53ffc7b};
  constexpr std::uint64_t kExpectedOdd[] = {0x45818de44f3a7781, 0x476b43cab0f1b325, 0x1f4396d8b6c661d1, 0xbfb61eab44256225, 0x13c8541d81790770};
  std::string all;
  for (std::size_t k = 0; k < std::size(kAll); ++k) {
    CAPTURE(ggml_type_name(kAll[k]));
    const std::uint64_t h = product_hash(kAll[k], 512);
    all += fmt::format("0x{:016x}, ", h);
    CHECK(h == kExpected[k]);
  }
  all += "five blocks: ";
  for (std::size_t k = 0; k < std::size(kExpectedOdd); ++k) {
    const GgmlType t = kAll[3 + k];
    CAPTURE(ggml_type_name(t));
    REQUIRE(block_of(t) == 32);
    const std::uint64_t h = product_hash(t, 160);
    all += fmt::format("0x{:016x}, ", h);
    CHECK(h == kExpectedOdd[k]);
  }
  MESSAGE(fmt::format("product hashes ({} build): {}", KVD_CPU_AVX2 ? "AVX2" : "portable", all));
}
