// Q/K/V traces: round trip, corruption and truncation, and what the decoder records.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "decoder/decoder.hpp"
#include "kvdrive/eval/recorded.hpp"
#include "kvdrive/research.hpp"
#include "model/llama2c.hpp"
#include "support.hpp"

using namespace kvdrive;

namespace {
std::string temp(const char* name) { return (std::filesystem::temp_directory_path() / name).string(); }
}  // namespace

TEST_CASE("trace: written records read back; corrupt or truncated files are rejected") {
  const ModelShape shape{3, 4, 2, 16};
  const auto path = temp("kvd_test.trace");
  for (DType dtype : {DType::f32, DType::bf16}) {
    {
      eval::TraceWriter w(path, shape, dtype);
      for (int pos = 0; pos < 5; ++pos)
        for (int l = 0; l < 3; ++l) {
          const auto q = test::random_floats(4 * 16, 100 * pos + l), k = test::random_floats(2 * 16, 200 * pos + l),
                     v = test::random_floats(2 * 16, 300 * pos + l);
          w.write(l, pos, q.data(), k.data(), v.data());
        }
      CHECK(w.records() == 15);
    }
    eval::TraceReader r(path);
    CHECK(r.records() == 15);
    CHECK(r.shape().q_heads == 4);
    CHECK(r.dtype() == dtype);
    CHECK(r.positions(2) == 5);
    std::vector<float> q, k, v;
    r.read(1, 3, q, k, v);
    const auto want = test::random_floats(2 * 16, 300 * 3 + 1);
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(v[i] == (dtype == DType::f32 ? want[i] : bf16_bits_to_float(float_to_bf16_bits(want[i]))));
    CHECK_THROWS_WITH_AS(r.read(3, 0, q, k, v), doctest::Contains("no record for layer 3"), Error);
  }
  // One flipped byte in a record fails the checksum; a cut-off file has no footer.
  std::vector<char> bytes(std::filesystem::file_size(path));
  std::ifstream(path, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  auto rewrite = [&](std::size_t size) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(size));
  };
  bytes[100] ^= 1;
  rewrite(bytes.size());
  CHECK_THROWS_WITH_AS(eval::TraceReader{path}, doctest::Contains("checksum mismatch"), Error);
  bytes[100] ^= 1;
  rewrite(bytes.size() - 30);
  CHECK_THROWS_WITH_AS(eval::TraceReader{path}, doctest::Contains("no footer"), Error);
  rewrite(10);
  CHECK_THROWS_WITH_AS(eval::TraceReader{path}, doctest::Contains("too short"), Error);
  // A footer claiming 2^60 records of 208 bytes (2^60 x 208 wraps to 0 in 64 bits) over no records.
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    eval::TraceHeader h{};
    std::memcpy(h.magic, eval::kTraceMagic, 8);
    h.version = 1;
    h.layers = h.q_heads = h.kv_heads = 1;
    h.head_dim = 16;
    eval::TraceFooter t{};
    std::memcpy(t.magic, eval::kTraceEnd, 8);
    t.records = std::uint64_t{1} << 60;
    t.checksum = XXH3_64bits(nullptr, 0);
    f.write(reinterpret_cast<const char*>(&h), sizeof h);
    f.write(reinterpret_cast<const char*>(&t), sizeof t);
  }
  CHECK_THROWS_WITH_AS(eval::TraceReader{path}, doctest::Contains("expected 1152921504606846976 records"), Error);
  // A header claiming 842150450 query and KV heads (found by fuzz_trace once it recomputed the
  // footer's checksum: q_heads + 2 x kv_heads overflowed an int) is refused as a bad shape.
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    eval::TraceHeader h{};
    std::memcpy(h.magic, eval::kTraceMagic, 8);
    h.version = 1;
    h.layers = 1;
    h.q_heads = h.kv_heads = 842150450;
    h.head_dim = 16;
    eval::TraceFooter t{};
    std::memcpy(t.magic, eval::kTraceEnd, 8);
    t.checksum = XXH3_64bits(nullptr, 0);
    f.write(reinterpret_cast<const char*>(&h), sizeof h);
    f.write(reinterpret_cast<const char*>(&t), sizeof t);
  }
  CHECK_THROWS_WITH_AS(eval::TraceReader{path}, doctest::Contains("bad shape in the header"), Error);
  // A writer destroyed by an exception leaves no footer: the trace is not mistaken for complete.
  try {
    eval::TraceWriter w(path, shape, DType::f32);
    const auto q = test::random_floats(4 * 16, 1), k = test::random_floats(2 * 16, 2);
    w.write(0, 0, q.data(), k.data(), k.data());
    throw std::runtime_error("the run failed");
  } catch (const std::runtime_error&) {
  }
  CHECK_THROWS_WITH_AS(eval::TraceReader{path}, doctest::Contains("no footer"), Error);
  std::filesystem::remove(path);
}

TEST_CASE("trace: the decoder records Q and K after RoPE and V, every layer and position") {
  const std::string model_path = std::string(KVD_MODELS_DIR) + "/stories260K.bin";
  if (!std::filesystem::exists(model_path)) {
    MESSAGE("SKIPPED: " << model_path << " is absent");
    return;
  }
  ThreadPool pool(2);
  const llama::Model m = llama::load_llama2c(model_path);
  const auto& c = m.config;
  Config cfg;
  cfg.shape = {c.layers, c.heads, c.kv_heads, c.head_dim()};
  cfg.dtype = DType::f32;
  cfg.budget = Budget::fraction(1.0);
  const auto path = temp("kvd_decoder.trace");
  {
    KvManager<index::Dense, eviction::Lru> kv(cfg);
    llama::Decoder dec(m, kv, pool, 2);
    eval::TraceWriter w(path, cfg.shape, DType::f32);
    dec.record(&w);
    const int prompt[] = {1, 42, 7};
    dec.prefill(prompt);
    dec.step(99);
    dec.step(5);
  }
  eval::TraceReader r(path);
  CHECK(r.records() == static_cast<std::size_t>(c.layers) * 5);
  for (int l = 0; l < c.layers; ++l) CHECK(r.positions(l) == 5);
  // Layer 0, position 0 (RoPE is the identity there): k = Wk rmsnorm(embedding of BOS).
  std::vector<float> q, k, v;
  r.read(0, 0, q, k, v);
  const float* emb = m.token_embedding.floats();
  std::vector<double> x(emb + c.dim, emb + 2 * c.dim);
  double ss = 0;
  for (double e : x) ss += e * e;
  const double inv = 1 / std::sqrt(ss / c.dim + 1e-5);
  for (int r_ = 0; r_ < c.kv_dim(); ++r_) {
    double want = 0;
    for (int j = 0; j < c.dim; ++j) want += m.layers[0].wk.floats()[r_ * c.dim + j] * m.layers[0].rms_att[j] * x[static_cast<std::size_t>(j)] * inv;
    CHECK(k[static_cast<std::size_t>(r_)] == doctest::Approx(want).epsilon(1e-4).scale(1));
  }
  // Position 1 (token 42): the recorded query is its projection rotated by RoPE, so each rotated
  // pair (2i, 2i+1) keeps the length it had before the rotation, and V is not rotated at all.
  r.read(0, 1, q, k, v);
  std::vector<double> x1(emb + 42 * c.dim, emb + 43 * c.dim);
  double ss1 = 0;
  for (double e : x1) ss1 += e * e;
  const double inv1 = 1 / std::sqrt(ss1 / c.dim + 1e-5);
  auto project = [&](const float* w, int row) {
    double y = 0;
    for (int j = 0; j < c.dim; ++j) y += w[row * c.dim + j] * m.layers[0].rms_att[j] * x1[static_cast<std::size_t>(j)] * inv1;
    return y;
  };
  const int hd = c.head_dim();
  for (int i = 0; i < c.dim; i += 2) {
    // Interleaved RoPE at position 1: the pair (i, i+1) turns by 10000^(-(i mod hd)/hd) radians.
    const double a = project(m.layers[0].wq.floats(), i), b = project(m.layers[0].wq.floats(), i + 1);
    const double angle = std::pow(10000.0, -static_cast<double>(i % hd) / hd);
    CHECK(q[static_cast<std::size_t>(i)] == doctest::Approx(a * std::cos(angle) - b * std::sin(angle)).epsilon(1e-4).scale(1));
    CHECK(q[static_cast<std::size_t>(i) + 1] == doctest::Approx(a * std::sin(angle) + b * std::cos(angle)).epsilon(1e-4).scale(1));
  }
  for (int i = 0; i < c.kv_dim(); ++i)
    CHECK(v[static_cast<std::size_t>(i)] == doctest::Approx(project(m.layers[0].wv.floats(), i)).epsilon(1e-4).scale(1));
  std::filesystem::remove(path);
}

TEST_CASE("RecordedTrace: the last positions are decode steps; with an end, only the positions before it are seen") {
  const ModelShape shape{2, 4, 2, 8};
  const auto path = temp("kvd_test_recorded.trace");
  const int positions = 20;
  const auto row = [](int l, int pos, int which, int n) { return test::random_floats(static_cast<std::size_t>(n), 1000 * which + 50 * pos + l); };
  {
    eval::TraceWriter w(path, shape, DType::f32);
    for (int pos = 0; pos < positions; ++pos)
      for (int l = 0; l < 2; ++l) w.write(l, pos, row(l, pos, 1, 32).data(), row(l, pos, 2, 16).data(), row(l, pos, 3, 16).data());
  }
  const int group = 2, d = 8;
  for (const std::int64_t end : {std::int64_t{-1}, std::int64_t{12}}) {
    CAPTURE(end);
    const eval::RecordedTrace tr(path, 3, end);
    const std::int64_t seen = end < 0 ? positions : end;
    CHECK(tr.positions() == seen);
    const eval::StreamTrace st = tr.stream(1, 1);  // layer 1, KV head 1: query heads 2 and 3
    CHECK(st.prefix == seen - 3);
    CHECK(st.steps == 3);
    CHECK(st.keys.size() == static_cast<std::size_t>(seen) * d);
    for (int s = 0; s < 3; ++s) {
      const auto q = row(1, static_cast<int>(st.prefix) + s, 1, 32);
      for (int j = 0; j < group * d; ++j) REQUIRE(st.query(s)[j] == q[static_cast<std::size_t>(d * group + j)]);
    }
    const auto k = row(1, static_cast<int>(seen) - 1, 2, 16);
    for (int j = 0; j < d; ++j) CHECK(st.key(seen - 1)[j] == k[static_cast<std::size_t>(d + j)]);
    CHECK(st.observed == st.prefix);  // fewer prompt positions than kept observation queries
  }
  CHECK_THROWS_WITH_AS(eval::RecordedTrace(path, 3, 21), doctest::Contains("positions up to 21"), Error);
  CHECK_THROWS_WITH_AS(eval::RecordedTrace(path, 12, 12), doctest::Contains("12 decode steps"), Error);
  std::filesystem::remove(path);
}
