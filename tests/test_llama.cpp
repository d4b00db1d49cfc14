// The reference Llama decoder (examples/llama3): RoPE, the llama2.c loader, chunked prefill, and
// end to end on the real stories260K model against an independent double-precision forward pass.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>
#include <vector>

#include "decoder/decoder.hpp"
#include "kvdrive/kvdrive.hpp"
#include "model/llama2c.hpp"
#include "app/run.hpp"  // reply_has, needle.hpp
#include "decoder/sampler.hpp"
#include "support.hpp"
#include "model/synthetic.hpp"

using namespace kvdrive;
using namespace kvdrive::llama;

namespace {

const std::string kStories = std::string(KVD_MODELS_DIR) + "/stories260K.bin";

bool have_stories() {
  if (std::filesystem::exists(kStories)) return true;
  MESSAGE("SKIPPED: " << kStories << " is absent; the stories260K tests need ../shared/models");
  return false;
}

Config kv_config(const LlamaConfig& c, Budget budget, int local_tokens = 64) {
  Config cfg;
  cfg.shape = {c.layers, c.heads, c.kv_heads, c.head_dim()};
  cfg.dtype = DType::f32;
  cfg.budget = budget;
  cfg.local_tokens = local_tokens;
  return cfg;
}

/// An independent forward pass in double precision, token by token, with full attention. It
/// reads the checkpoint itself, following the llama2.c layout in ../shared/models/README.md.
class ReferenceLlama {
 public:
  explicit ReferenceLlama(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    int h[7];
    f.read(reinterpret_cast<char*>(h), sizeof h);
    dim_ = h[0], hid_ = h[1], layers_ = h[2], heads_ = h[3], kv_heads_ = h[4], vocab_ = std::abs(h[5]);
    hd_ = dim_ / heads_;
    std::vector<float> raw((std::filesystem::file_size(path) - sizeof h) / 4);
    f.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size() * 4));
    w_.assign(raw.begin(), raw.end());
    std::size_t o = 0;
    auto at = [&](std::size_t n) {
      const std::size_t p = o;
      o += n;
      return p;
    };
    const std::size_t D = dim_, H = hid_, L = layers_, KV = static_cast<std::size_t>(kv_heads_) * hd_;
    emb_ = at(vocab_ * D), att_ = at(L * D), wq_ = at(L * D * D), wk_ = at(L * KV * D), wv_ = at(L * KV * D);
    wo_ = at(L * D * D), ffn_ = at(L * D), w1_ = at(L * H * D), w2_ = at(L * D * H), w3_ = at(L * H * D), fin_ = at(D);
    kc_.assign(L, {});
    vc_.assign(L, {});
  }

  std::vector<double> forward(int token) {
    const std::size_t D = dim_, H = hid_, KV = static_cast<std::size_t>(kv_heads_) * hd_;
    std::vector<double> x(w_.begin() + static_cast<long>(emb_ + token * D), w_.begin() + static_cast<long>(emb_ + (token + 1) * D));
    for (int l = 0; l < layers_; ++l) {
      auto xb = rms(x, att_ + l * D);
      auto q = mat(wq_ + l * D * D, xb, D), k = mat(wk_ + l * KV * D, xb, KV), v = mat(wv_ + l * KV * D, xb, KV);
      rope(q, heads_);
      rope(k, kv_heads_);
      kc_[l].push_back(k);
      vc_[l].push_back(v);
      std::vector<double> out(D, 0.0);
      for (int qh = 0; qh < heads_; ++qh) {
        const int kh = qh / (heads_ / kv_heads_);
        std::vector<double> s(kc_[l].size());
        double m = -INFINITY;
        for (std::size_t t = 0; t < s.size(); ++t) {
          double dot = 0;
          for (int j = 0; j < hd_; ++j) dot += q[qh * hd_ + j] * kc_[l][t][kh * hd_ + j];
          m = std::max(m, s[t] = dot / std::sqrt(static_cast<double>(hd_)));
        }
        double z = 0;
        for (auto& e : s) z += (e = std::exp(e - m));
        for (std::size_t t = 0; t < s.size(); ++t)
          for (int j = 0; j < hd_; ++j) out[qh * hd_ + j] += s[t] / z * vc_[l][t][kh * hd_ + j];
      }
      auto o = mat(wo_ + l * D * D, out, D);
      for (std::size_t i = 0; i < D; ++i) x[i] += o[i];
      xb = rms(x, ffn_ + l * D);
      auto h1 = mat(w1_ + l * H * D, xb, H), h3 = mat(w3_ + l * H * D, xb, H);
      for (std::size_t i = 0; i < H; ++i) h1[i] = h1[i] / (1 + std::exp(-h1[i])) * h3[i];
      auto f = mat(w2_ + l * D * H, h1, D, H);
      for (std::size_t i = 0; i < D; ++i) x[i] += f[i];
    }
    ++pos_;
    return mat(emb_, rms(x, fin_), static_cast<std::size_t>(vocab_));
  }

 private:
  std::vector<double> rms(const std::vector<double>& x, std::size_t g) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1 / std::sqrt(ss / static_cast<double>(x.size()) + 1e-5);
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = w_[g + i] * x[i] * inv;
    return y;
  }
  std::vector<double> mat(std::size_t w, const std::vector<double>& x, std::size_t out, std::size_t in = 0) const {
    if (!in) in = x.size();
    std::vector<double> y(out, 0.0);
    for (std::size_t r = 0; r < out; ++r)
      for (std::size_t j = 0; j < in; ++j) y[r] += w_[w + r * in + j] * x[j];
    return y;
  }
  void rope(std::vector<double>& x, int heads) const {  // interleaved pairs, theta 10000
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < hd_; i += 2) {
        const double a = static_cast<double>(pos_) / std::pow(10000.0, static_cast<double>(i) / hd_);
        const double x0 = x[h * hd_ + i], x1 = x[h * hd_ + i + 1];
        x[h * hd_ + i] = x0 * std::cos(a) - x1 * std::sin(a);
        x[h * hd_ + i + 1] = x0 * std::sin(a) + x1 * std::cos(a);
      }
  }

  std::vector<double> w_;
  int dim_, hid_, layers_, heads_, kv_heads_, vocab_, hd_;
  std::size_t emb_, att_, wq_, wk_, wv_, wo_, ffn_, w1_, w2_, w3_, fin_;
  std::vector<std::vector<std::vector<double>>> kc_, vc_;
  long pos_ = 0;
};

/// Greedy decoding from BOS: the generated ids and every step's logits.
template <class Index>
std::vector<int> greedy(const Model& m, ThreadPool& pool, Config cfg, int steps, std::vector<std::vector<float>>* logits = nullptr) {
  KvManager<Index, eviction::Lru> kv(cfg, {}, {}, {}, {}, backend::Cpu({2}));
  Decoder dec(m, kv, pool);
  const int bos[] = {1};
  const std::vector<float>* l = &dec.prefill(bos);
  std::vector<int> ids;
  for (int s = 0; s < steps; ++s) {
    if (logits) logits->push_back(*l);
    ids.push_back(Sampler::argmax(*l));
    if (s + 1 < steps) l = &dec.step(ids.back());
  }
  return ids;
}

}  // namespace

TEST_CASE("RoPE: both layouts and Llama-3 scaling against a direct computation") {
  const int d = 16;
  const auto x = test::random_floats(3 * d, 4);
  for (RopeLayout layout : {RopeLayout::interleaved, RopeLayout::half})
    for (RopeScaling scaling : {RopeScaling{}, RopeScaling{8.0, 1.0, 4.0, 8192}}) {
      const double theta = 500000.0;
      Rope rope(d, theta, layout, scaling);
      for (long pos : {0L, 1L, 17L, 5000L, 100000L}) {
        std::vector<float> y(x);
        rope.rotate(y.data(), 3, pos);
        for (int h = 0; h < 3; ++h)
          for (int i = 0; i < d / 2; ++i) {
            // The frequency, directly from its definition.
            double f = std::pow(theta, -2.0 * i / d);
            if (scaling.factor > 0) {
              const double wavelen = 2 * M_PI / f, lo = 8192 / 1.0, hi = 8192 / 4.0;
              if (wavelen > lo) f = f / 8;
              else if (wavelen >= hi) {
                const double sm = (8192 / wavelen - 1) / 3;
                f = (1 - sm) * f / 8 + sm * f;
              }
            }
            const int a = layout == RopeLayout::interleaved ? 2 * i : i;
            const int b = layout == RopeLayout::interleaved ? 2 * i + 1 : i + d / 2;
            // (x_a + i x_b) e^{i pos f}
            const double ang = static_cast<double>(pos) * f;
            const double re = x[h * d + a] * std::cos(ang) - x[h * d + b] * std::sin(ang);
            const double im = x[h * d + a] * std::sin(ang) + x[h * d + b] * std::cos(ang);
            REQUIRE(y[h * d + a] == doctest::Approx(re).epsilon(1e-5).scale(1));
            REQUIRE(y[h * d + b] == doctest::Approx(im).epsilon(1e-5).scale(1));
          }
      }
    }
}

TEST_CASE("index_for: Hierarchical's rotary pairs are the ones the model's RoPE rotates together") {
  // RoPE turns each pair of channels it rotates together by an angle, so the norm of every such
  // pair of a query is the same at every position: that holds for the index's pairs only when
  // they follow the model's layout.
  const int d = 16;
  const auto x = test::random_floats(d, 9);
  for (RopeLayout layout : {RopeLayout::interleaved, RopeLayout::half}) {
    LlamaConfig c;
    c.rope_layout = layout;
    const index::Hierarchical h = index_for<index::Hierarchical>(c);
    CHECK(h.params.rotary == (layout == RopeLayout::half ? index::RotaryPairs::halves : index::RotaryPairs::adjacent));
    const Rope rope(d, 10000.0, layout);
    std::vector<float> y(x);
    rope.rotate(y.data(), 1, 1234);
    for (int j = 0; j < d / 2; ++j)
      CHECK(index::pair_norm(y.data(), h.params.rotary, j, d) == doctest::Approx(index::pair_norm(x.data(), h.params.rotary, j, d)).epsilon(1e-5));
    // The other layout's pairs are not preserved.
    const auto other = h.params.rotary == index::RotaryPairs::halves ? index::RotaryPairs::adjacent : index::RotaryPairs::halves;
    double moved = 0;
    for (int j = 0; j < d / 2; ++j) moved += std::abs(index::pair_norm(y.data(), other, j, d) - index::pair_norm(x.data(), other, j, d));
    CHECK(moved > 1e-2);
  }
  [[maybe_unused]] const index::Quest quest = index_for<index::Quest>(LlamaConfig{});  // indices without pairs: default
}

TEST_CASE("llama2.c loader: malformed checkpoints give clear errors") {
  const auto dir = std::filesystem::temp_directory_path() / "kvd_test_llama2c";
  std::filesystem::create_directories(dir);
  auto write = [&](const char* name, std::vector<int> header, std::size_t floats) {
    const auto p = (dir / name).string();
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size() * 4));
    std::vector<float> zeros(floats, 0.0f);
    f.write(reinterpret_cast<const char*>(zeros.data()), static_cast<std::streamsize>(floats * 4));
    return p;
  };
  // A consistent tiny model: dim 8, hidden 16, 1 layer, 2 heads, 1 KV head, vocab 10, seq 4.
  const std::size_t good = 10 * 8 + 8 + 64 + 2 * 4 * 8 + 64 + 8 + 3 * 16 * 8 + 8 + 2 * 4 * 2;
  CHECK_NOTHROW(load_llama2c(write("good.bin", {8, 16, 1, 2, 1, 10, 4}, good)));
  const Model m = load_llama2c(write("untied.bin", {8, 16, 1, 2, 1, -10, 4}, good + 80));
  CHECK_FALSE(m.config.tied_embeddings);
  CHECK(m.classifier.data != m.token_embedding.data);
  CHECK_THROWS_WITH_AS(load_llama2c(write("short.bin", {8, 16, 1, 2, 1, 10, 4}, good - 1)), doctest::Contains("header implies"), Error);
  CHECK_THROWS_WITH_AS(load_llama2c(write("long.bin", {8, 16, 1, 2, 1, 10, 4}, good + 3)), doctest::Contains("not a llama2.c checkpoint"), Error);
  CHECK_THROWS_WITH_AS(load_llama2c(write("zero.bin", {8, 0, 1, 2, 1, 10, 4}, good)), doctest::Contains("hidden_dim is 0, expected > 0"), Error);
  CHECK_THROWS_WITH_AS(load_llama2c(write("neg.bin", {8, 16, -1, 2, 1, 10, 4}, good)), doctest::Contains("n_layers is -1"), Error);
  CHECK_THROWS_WITH_AS(load_llama2c(write("header.bin", {8, 16, 1}, 0)), doctest::Contains("shorter than the 28-byte"), Error);
  CHECK_THROWS_WITH_AS(load_llama2c(write("heads.bin", {8, 16, 1, 3, 1, 10, 4}, good)), doctest::Contains("not a multiple"), Error);
  CHECK_THROWS_WITH_AS(load_llama2c((dir / "missing.bin").string()), doctest::Contains("cannot open"), Error);
  // Sizes whose byte count wraps around 2^64 to the file's size must not be accepted.
  CHECK_THROWS_WITH_AS(load_llama2c(write("wrap.bin", {1048576, 699048, 1048576, 524288, 1, 2097151, 1}, 2)), doctest::Contains("overflow"), Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("synthetic models: names, seeds and shape overrides") {
  CHECK(parse_synthetic("model.bin") == std::nullopt);
  CHECK(parse_synthetic("synthetic:small")->preset == "small");
  CHECK(parse_synthetic("synthetic:small:seed=42")->seed == 42);
  CHECK_THROWS_WITH_AS(parse_synthetic("synthetic:small:seed=x"), doctest::Contains("synthetic:NAME:seed=N"), Error);
  ThreadPool pool(2);
  CHECK_THROWS_WITH_AS(make_synthetic({"huge", 1}, {}, pool), doctest::Contains("unknown synthetic model 'huge'"), Error);
  const Model m =
      make_synthetic({"tiny", 3}, ShapeOverrides{.layers = 1, .heads = 4, .kv_heads = 2, .head_dim = 16, .hidden = {}, .vocab = {}}, pool);
  CHECK(m.config.layers == 1);
  CHECK(m.config.dim == 64);
  CHECK(m.config.kv_dim() == 32);
  const Model again =
      make_synthetic({"tiny", 3}, ShapeOverrides{.layers = 1, .heads = 4, .kv_heads = 2, .head_dim = 16, .hidden = {}, .vocab = {}}, pool);
  CHECK(std::memcmp(m.layers[0].wq.data, again.layers[0].wq.data, 64 * 64 * 4) == 0);
}

/// The logits after the last token of `prompt`, decoded token by token (the reference for prefill).
static std::vector<float> logits_token_by_token(const Model& m, const Config& cfg, ThreadPool& pool, std::span<const int> prompt) {
  KvManager<index::Dense, eviction::Lru> kv(cfg);
  Decoder stepped(m, kv, pool);
  std::vector<float> logits = stepped.prefill(prompt.first(1));
  for (std::size_t i = 1; i < prompt.size(); ++i) logits = stepped.step(prompt[i]);
  return logits;
}

/// The synthetic model "tiny" with seed `seed`, cut to two layers.
static Model two_layer_tiny(std::uint64_t seed, ThreadPool& pool) {
  return make_synthetic({"tiny", seed}, ShapeOverrides{.layers = 2, .heads = {}, .kv_heads = {}, .head_dim = {}, .hidden = {}, .vocab = {}}, pool);
}

/// n token ids below 512, drawn by std::mt19937(seed).
static std::vector<int> random_prompt(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int> prompt(n);
  for (auto& t : prompt) t = static_cast<int>(rng() % 512);
  return prompt;
}

static double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  return worst;
}

TEST_CASE("chunked prefill gives the logits of decoding the prompt token by token") {
  ThreadPool pool(2);
  const Model m = two_layer_tiny(5, pool);
  const std::vector<int> prompt = random_prompt(150, 1);
  const Config cfg = kv_config(m.config, Budget::fraction(1.0));
  KvManager<index::Dense, eviction::Lru> b(cfg);
  Decoder stepped(m, b, pool);
  std::vector<float> want = stepped.prefill(std::span<const int>(prompt).first(1));
  for (std::size_t i = 1; i < prompt.size(); ++i) want = stepped.step(prompt[i]);
  const int next = Sampler::argmax(stepped.step(7));
  // Chunks that do and do not line up with the 16-token query tiles and 64-key blocks.
  for (int chunk : {1, 7, 16, 37, 64, 150, 256}) {
    CAPTURE(chunk);
    KvManager<index::Dense, eviction::Lru> a(cfg);
    Decoder chunked(m, a, pool, chunk);
    CHECK(max_abs_diff(chunked.prefill(prompt), want) < 1e-4);
    CHECK(Sampler::argmax(chunked.step(7)) == next);  // then both decode the same
  }
}

TEST_CASE("chunked prefill with an f16 or bf16 KV cache: the prompt attended in the KV dtype gives the logits of decoding token by token") {
  ThreadPool pool(2);
  const Model m = two_layer_tiny(5, pool);
  const std::vector<int> prompt = random_prompt(120, 2);
  for (DType dt : {DType::f16, DType::bf16}) {
    CAPTURE(static_cast<int>(dt));
    Config cfg = kv_config(m.config, Budget::fraction(1.0));
    cfg.dtype = dt;
    const std::vector<float> want = logits_token_by_token(m, cfg, pool, prompt);
    for (int chunk : {16, 37}) {
      CAPTURE(chunk);
      KvManager<index::Dense, eviction::Lru> a(cfg);
      Decoder chunked(m, a, pool, chunk);
      CHECK(max_abs_diff(chunked.prefill(prompt), want) < 1e-4);
    }
  }
}

TEST_CASE("PromptKv: the prompt's K/V in the KV dtype, one block of streams x tokens x head_dim each; attended as float copies of its values") {
  constexpr int kKvHeads = 2, kHeads = 4, kDim = 16;
  constexpr std::int64_t kTokens = 40, kP0 = 24;  // the chunk: the last 16 tokens
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> k(static_cast<std::size_t>(kTokens) * kKvHeads * kDim), v(k.size()), q(static_cast<std::size_t>(kTokens - kP0) * kHeads * kDim);
  for (auto* x : {&k, &v, &q})
    for (float& f : *x) f = normal(rng);
  ThreadPool pool(2);
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    CAPTURE(static_cast<int>(dt));
    PromptKv p;
    p.start(dt, kKvHeads, kDim, kTokens);
    CHECK(p.bytes() == 2u * kKvHeads * kTokens * kDim * dtype_size(dt));  // exactly the prompt, K and V
    // The expectation: each head's rows rounded to the dtype, kept as float.
    std::vector<float> want_k(k.size()), want_v(v.size());
    for (int h = 0; h < kKvHeads; ++h)
      for (std::int64_t t = 0; t < kTokens; ++t) {
        const std::size_t from = (static_cast<std::size_t>(t) * kKvHeads + h) * kDim, to = (static_cast<std::size_t>(h) * kTokens + t) * kDim;
        p.append(static_cast<std::size_t>(h), k.data() + from, v.data() + from);
        std::copy_n(k.data() + from, kDim, want_k.data() + to);
        std::copy_n(v.data() + from, kDim, want_v.data() + to);
      }
    index::round_to_dtype(dt, want_k.data(), want_k.size());
    index::round_to_dtype(dt, want_v.data(), want_v.size());
    CHECK(p.rows(1) == kTokens);
    CHECK_THROWS_WITH_AS(p.append(0, k.data(), v.data()), doctest::Contains("stream 0 is full"), Error);
    CausalAttentionArgs<float> expect;
    expect.q = q.data();
    expect.keys = want_k.data();
    expect.values = want_v.data();
    expect.stream_stride = static_cast<std::size_t>(kTokens) * kDim;
    expect.p0 = kP0;
    expect.tokens = kTokens - kP0;
    expect.heads = kHeads, expect.kv_heads = kKvHeads, expect.head_dim = kDim;
    expect.scale = 0.25f;
    std::vector<float> want(q.size()), got(q.size());
    expect.out = want.data();
    causal_attention(pool, expect);
    p.visit([&](const auto& rows) {
      for (std::size_t i = 0; i < want_k.size(); ++i) {
        CHECK(to_float(rows.k[i]) == want_k[i]);
        CHECK(to_float(rows.v[i]) == want_v[i]);
      }
      CausalAttentionArgs<typename std::decay_t<decltype(rows)>::Element> a;
      a.q = q.data(), a.out = got.data(), a.keys = rows.k, a.values = rows.v, a.stream_stride = rows.stream_stride;
      a.p0 = expect.p0, a.tokens = expect.tokens, a.heads = kHeads, a.kv_heads = kKvHeads, a.head_dim = kDim, a.scale = expect.scale;
      causal_attention(pool, a);
    });
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);  // bit for bit: the same values, widened as loaded
    p.clear();
    CHECK(p.bytes() == 0);
  }
}

TEST_CASE("the decoder's tune_clusters(): layer 0 chooses the cluster size, every layer is indexed with it") {
  ThreadPool pool(2);
  const Model m = two_layer_tiny(9, pool);
  const std::vector<int> prompt = random_prompt(700, 3);
  Config cfg = kv_config(m.config, Budget::fraction(0.125), 16);
  cfg.page_tokens = 4;
  using M = KvManager<index::Hierarchical, eviction::Lookahead>;
  M tuned(cfg);
  Decoder a(m, tuned, pool, 128);  // chunked prefill: the index is built chunk by chunk, then rebuilt
  a.warm_up_after_prefill(16);
  a.tune_clusters();
  a.prefill(prompt);
  const auto& choice = a.cluster_choice();
  REQUIRE(choice.cases.size() == M::kClusterSizes.size());
  CHECK(tuned.index_policy().params.pages_per_cluster == choice.pages_per_cluster);
  // A manager with that size from the start, prefilled in one chunk: the same index everywhere.
  index::HierarchicalParams p;
  p.pages_per_cluster = choice.pages_per_cluster;
  M fixed(cfg, index::Hierarchical{p});
  Decoder b(m, fixed, pool, 1024);
  b.warm_up_after_prefill(16);
  b.prefill(prompt);
  for (int l = 0; l < m.config.layers; ++l)
    for (int h = 0; h < m.config.kv_heads; ++h) {
      CAPTURE(l);
      CHECK(tuned.index_state(a.sequence(), l, h).cluster_of == fixed.index_state(b.sequence(), l, h).cluster_of);
    }
  CHECK(Sampler::argmax(a.step(5)) == Sampler::argmax(b.step(5)));
}

TEST_CASE("stories260K: dense greedy decoding matches an independent double-precision forward pass") {
  if (!have_stories()) return;
  ThreadPool pool(2);
  const Model m = load_llama2c(kStories);
  const Config cfg = kv_config(m.config, Budget::fraction(1.0));
  std::vector<std::vector<float>> logits;
  const auto ids = greedy<index::Dense>(m, pool, cfg, 32, &logits);
  CHECK(greedy<index::Dense>(m, pool, cfg, 32) == ids);  // deterministic

  ReferenceLlama ref(kStories);
  int token = 1;
  double worst = 0;
  for (int pos = 0; pos < 32; ++pos) {
    const auto want = ref.forward(token);
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::fabs(v));
    for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(want[i] - logits[static_cast<std::size_t>(pos)][i]) / scale);
    CHECK(Sampler::argmax(logits[static_cast<std::size_t>(pos)]) == static_cast<int>(std::max_element(want.begin(), want.end()) - want.begin()));
    token = ids[static_cast<std::size_t>(pos)];
  }
  MESSAGE("stories260K: worst logit error relative to the largest logit over 32 positions: " << worst);
  CHECK(worst < 1e-4);
}

TEST_CASE("stories260K: sparse with budget 1.0 gives bitwise the logits of dense") {
  if (!have_stories()) return;
  ThreadPool pool(2);
  const Model m = load_llama2c(kStories);
  std::vector<std::vector<float>> dense, sparse;
  const auto a = greedy<index::Dense>(m, pool, kv_config(m.config, Budget::fraction(1.0)), 100, &dense);
  const auto b = greedy<index::Oracle>(m, pool, kv_config(m.config, Budget::fraction(1.0)), 100, &sparse);
  CHECK(a == b);
  for (std::size_t i = 0; i < dense.size(); ++i) REQUIRE(std::memcmp(dense[i].data(), sparse[i].data(), dense[i].size() * 4) == 0);
}

TEST_CASE("stories260K: sparse at budget 0.5 agrees with dense on teacher-forced text") {
  if (!have_stories()) return;
  ThreadPool pool(2);
  const Model m = load_llama2c(kStories);
  const auto text = greedy<index::Dense>(m, pool, kv_config(m.config, Budget::fraction(1.0), 16), 320);
  // Feed the same 320 tokens to a dense and a sparse decoder; compare the next-token logits.
  // Token-sized pages and the mass oracle: the best any selection can do at half the tokens
  // (this model's heads are only 8 wide; with 8-token pages the same budget agrees 50-52 of 64).
  Config sparse_cfg = kv_config(m.config, Budget::fraction(0.5), 16);
  sparse_cfg.page_tokens = 1;
  KvManager<index::Dense, eviction::Lru> dkv(kv_config(m.config, Budget::fraction(1.0), 16));
  KvManager<index::OracleMass, eviction::Lru> skv(sparse_cfg);
  Decoder dd(m, dkv, pool);
  Decoder sd(m, skv, pool);
  const int bos[] = {1};
  dd.prefill(bos);
  sd.prefill(bos);
  int agree = 0, compared = 0;
  double kl = 0;
  for (int pos = 1; pos < 320; ++pos) {
    const auto& p = dd.step(text[static_cast<std::size_t>(pos - 1)]);
    const auto& q = sd.step(text[static_cast<std::size_t>(pos - 1)]);
    if (pos < 256) continue;
    ++compared;
    agree += Sampler::argmax(p) == Sampler::argmax(q);
    // KL(dense || sparse) of the next-token distributions.
    const float mp = *std::max_element(p.begin(), p.end()), mq = *std::max_element(q.begin(), q.end());
    double zp = 0, zq = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      zp += std::exp(static_cast<double>(p[i] - mp));
      zq += std::exp(static_cast<double>(q[i] - mq));
    }
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double lp = p[i] - mp - std::log(zp), lq = q[i] - mq - std::log(zq);
      kl += std::exp(lp) * (lp - lq);
    }
  }
  MESSAGE("stories260K teacher-forced, positions 256-319: argmax agreement " << agree << "/" << compared << ", mean KL(dense || sparse) "
                                                                             << kl / compared);
  CHECK(agree >= 0.9 * compared);
  CHECK(skv.total_stats().selected < skv.total_stats().candidates);  // it really was sparse
}

// ---- Hugging Face folders -------------------------------------------------------------------

#include "model/hf_loader.hpp"

namespace {

struct StTensor {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;
};

/// Writes a safetensors file; `mutate` may edit the JSON header before it is written.
void write_safetensors(const std::filesystem::path& path, const std::vector<StTensor>& tensors,
                       const std::function<void(nlohmann::json&)>& mutate = {}) {
  nlohmann::json h;
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
  }
  h["__metadata__"] = {{"format", "pt"}};
  if (mutate) mutate(h);
  std::string text = h.dump();
  while (text.size() % 8) text += ' ';
  std::ofstream f(path, std::ios::binary);
  const std::uint64_t n = text.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(text.data(), static_cast<std::streamsize>(n));
  for (const auto& t : tensors) f.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
}

StTensor encode(const std::string& name, const float* x, std::vector<std::int64_t> shape, const std::string& dtype);
StTensor encode(const std::string& name, const Matrix& w, std::vector<std::int64_t> shape, const std::string& dtype) {
  REQUIRE(w.is_f32());
  return encode(name, w.floats(), std::move(shape), dtype);
}

StTensor encode(const std::string& name, const float* x, std::vector<std::int64_t> shape, const std::string& dtype) {
  StTensor t{name, dtype, shape, {}};
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  t.bytes.resize(static_cast<std::size_t>(n) * (dtype == "F32" ? 4 : 2));
  for (std::int64_t i = 0; i < n; ++i) {
    if (dtype == "F32") {
      std::memcpy(t.bytes.data() + 4 * i, x + i, 4);
    } else {
      const std::uint16_t b = dtype == "F16" ? float_to_half_bits(x[i]) : float_to_bf16_bits(x[i]);
      std::memcpy(t.bytes.data() + 2 * i, &b, 2);
    }
  }
  return t;
}

/// The tensors of a model under Hugging Face names.
std::vector<StTensor> hf_tensors(const Model& m, const std::string& dtype) {
  const auto& c = m.config;
  const std::int64_t D = c.dim, H = c.hidden_dim, KV = c.kv_dim(), V = c.vocab;
  std::vector<StTensor> t{encode("model.embed_tokens.weight", m.token_embedding, {V, D}, dtype)};
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const LayerWeights& w = m.layers[static_cast<std::size_t>(l)];
    t.push_back(encode(p + "input_layernorm.weight", w.rms_att, {D}, dtype));
    t.push_back(encode(p + "self_attn.q_proj.weight", w.wq, {D, D}, dtype));
    t.push_back(encode(p + "self_attn.k_proj.weight", w.wk, {KV, D}, dtype));
    t.push_back(encode(p + "self_attn.v_proj.weight", w.wv, {KV, D}, dtype));
    t.push_back(encode(p + "self_attn.o_proj.weight", w.wo, {D, D}, dtype));
    t.push_back(encode(p + "post_attention_layernorm.weight", w.rms_ffn, {D}, dtype));
    t.push_back(encode(p + "mlp.gate_proj.weight", w.w1, {H, D}, dtype));
    t.push_back(encode(p + "mlp.down_proj.weight", w.w2, {D, H}, dtype));
    t.push_back(encode(p + "mlp.up_proj.weight", w.w3, {H, D}, dtype));
  }
  t.push_back(encode("model.norm.weight", m.rms_final, {D}, dtype));
  return t;
}

void write_config(const std::filesystem::path& dir, const LlamaConfig& c, const std::string& torch_dtype) {
  nlohmann::json j = {{"hidden_size", c.dim},
                      {"intermediate_size", c.hidden_dim},
                      {"num_hidden_layers", c.layers},
                      {"num_attention_heads", c.heads},
                      {"num_key_value_heads", c.kv_heads},
                      {"vocab_size", c.vocab},
                      {"max_position_embeddings", 2048},
                      {"rope_theta", c.rope_theta},
                      {"rms_norm_eps", c.rms_eps},
                      {"tie_word_embeddings", true},
                      {"torch_dtype", torch_dtype}};
  std::ofstream(dir / "config.json") << j.dump(2);
}

/// Logits of a short greedy run.
std::vector<float> run_logits(const Model& m, ThreadPool& pool) {
  Config cfg;
  cfg.shape = {m.config.layers, m.config.heads, m.config.kv_heads, m.config.head_dim()};
  cfg.dtype = DType::f32;
  cfg.budget = Budget::fraction(1.0);
  KvManager<index::Dense, eviction::Lru> kv(cfg);
  Decoder dec(m, kv, pool);
  const int prompt[] = {1, 17, 99, 3};
  std::vector<float> last = dec.prefill(prompt), all = last;
  for (int s = 0; s < 6; ++s) {
    last = dec.step(Sampler::argmax(last));
    all.insert(all.end(), last.begin(), last.end());
  }
  return all;
}

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const char* name) : path(std::filesystem::temp_directory_path() / name) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST_CASE("Hugging Face folders: fp32, fp16 and bf16, sharded and not, load the same model") {
  ThreadPool pool(2);
  const Model src = two_layer_tiny(9, pool);
  const auto want = run_logits(src, pool);
  for (const std::string dtype : {"F32", "F16", "BF16"})
    for (bool sharded : {false, true}) {
      CAPTURE(dtype);
      CAPTURE(sharded);
      TempDir dir("kvd_test_hf");
      write_config(dir.path, src.config, dtype == "F32" ? "float32" : dtype == "F16" ? "float16" : "bfloat16");
      auto tensors = hf_tensors(src, dtype);
      if (!sharded) {
        write_safetensors(dir.path / "model.safetensors", tensors);
      } else {
        const auto half = tensors.size() / 2;
        const std::vector<StTensor> a(tensors.begin(), tensors.begin() + static_cast<long>(half)),
            b(tensors.begin() + static_cast<long>(half), tensors.end());
        write_safetensors(dir.path / "model-00001-of-00002.safetensors", a);
        write_safetensors(dir.path / "model-00002-of-00002.safetensors", b);
        nlohmann::json index;
        for (const auto& t : a) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
        for (const auto& t : b) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
        std::ofstream(dir.path / "model.safetensors.index.json") << index.dump();
      }
      const Model m = load_hf(dir.path);
      CHECK(m.config.layers == 2);
      CHECK(m.config.rope_layout == RopeLayout::half);
      if (dtype == "F32") {
        // Mapped in place, and the very same model.
        CHECK(m.owned.empty());
        const auto got = run_logits(m, pool);
        REQUIRE(got.size() == want.size());
        CHECK(std::memcmp(got.data(), want.data(), got.size() * 4) == 0);
      } else {
        // Converted exactly: every weight is the rounding of the original.
        const std::size_t n = static_cast<std::size_t>(src.config.hidden_dim) * src.config.dim;
        for (std::size_t i = 0; i < n; ++i) {
          const float r = dtype == "F16" ? half_bits_to_float(float_to_half_bits(src.layers[1].w2.floats()[i]))
                                         : bf16_bits_to_float(float_to_bf16_bits(src.layers[1].w2.floats()[i]));
          REQUIRE(m.layers[1].w2.floats()[i] == r);
        }
      }
    }
}

TEST_CASE("Hugging Face folders: malformed files give errors naming the file and the problem") {
  ThreadPool pool(2);
  const Model src =
      make_synthetic({"tiny", 9}, ShapeOverrides{.layers = 1, .heads = {}, .kv_heads = {}, .head_dim = {}, .hidden = {}, .vocab = {}}, pool);
  TempDir dir("kvd_test_hf_bad");
  const auto file = dir.path / "model.safetensors";
  auto expect_error = [&](const std::string& what) {
    CAPTURE(what);
    try {
      load_hf(dir.path);
      FAIL("no error");
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK(msg.find(what) != std::string::npos);
      CHECK((msg.find(dir.path.string()) != std::string::npos));  // names the file or folder
    }
  };
  write_config(dir.path, src.config, "float32");
  const auto good = hf_tensors(src, "F32");

  { std::ofstream(file, std::ios::binary) << "abc"; }
  expect_error("too short for the 8-byte");

  {
    std::ofstream f(file, std::ios::binary);
    const std::uint64_t n = 1000;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << "{}";
  }
  expect_error("runs past the end of the file");

  write_safetensors(file, good, [](nlohmann::json& h) { h["model.norm.weight"]["data_offsets"][1] = 1u << 30; });
  expect_error("out of range");

  write_safetensors(file, good, [&](nlohmann::json& h) {
    h["model.norm.weight"]["data_offsets"] = h["model.embed_tokens.weight"]["data_offsets"];
    h["model.norm.weight"]["shape"] = h["model.embed_tokens.weight"]["shape"];
  });
  expect_error("overlap");

  write_safetensors(file, good, [](nlohmann::json& h) { h.erase("model.layers.0.mlp.up_proj.weight"); });
  expect_error("tensor 'model.layers.0.mlp.up_proj.weight' is missing");

  auto wrong_shape = good;
  wrong_shape[1] = encode("model.layers.0.input_layernorm.weight", src.layers[0].rms_att, {32}, "F32");
  write_safetensors(file, wrong_shape);
  expect_error("has shape [32], config.json implies [64]");

  write_safetensors(file, hf_tensors(src, "F16"));  // config.json says float32
  expect_error("has dtype F16 but config.json says torch_dtype float32");

  write_safetensors(file, good, [](nlohmann::json& h) {
    h["model.norm.weight"]["shape"] = {4294967296LL, 4294967296LL};  // 2^64 elements in 0 bytes
    h["model.norm.weight"]["data_offsets"] = {0, 0};
  });
  expect_error("too many elements");

  // 2^62 F32 elements fit an int64, but their 2^64 bytes wrap to 0: the header must not pass as a 0-byte tensor.
  write_safetensors(file, good, [](nlohmann::json& h) {
    h["model.norm.weight"]["shape"] = {2147483648LL, 2147483648LL};
    std::uint64_t end = 0;  // an empty range at the end of the data overlaps nothing
    for (auto& [name, t] : h.items())
      if (name != "__metadata__") end = std::max(end, t["data_offsets"][1].get<std::uint64_t>());
    h["model.norm.weight"]["data_offsets"] = {end, end};
  });
  try {
    SafetensorsFile st(file.string());
    FAIL("a 2^64-byte tensor stored in 0 bytes was accepted");
  } catch (const Error& e) {
    CHECK_MESSAGE(std::string(e.what()).find("has too many bytes") != std::string::npos, std::string(e.what()));
  }

  write_safetensors(file, good);
  CHECK_NOTHROW(load_hf(dir.path));
  {
    nlohmann::json j = read_json(dir.path / "config.json");
    j["hidden_size"] = 4294967360LL;  // would truncate to 64 as an int
    std::ofstream(dir.path / "config.json") << j.dump();
  }
  expect_error("'hidden_size' is 4294967360");
  {
    // 131074 x 32768 = 2^32 + 65536: as an int product it wraps to hidden_size and a wrong head_dim passes.
    nlohmann::json j = read_json(dir.path / "config.json");
    j["hidden_size"] = 65536;
    j["num_attention_heads"] = 32768;
    j["num_key_value_heads"] = 32768;
    j["head_dim"] = 131074;
    std::ofstream(dir.path / "config.json") << j.dump();
    CHECK_THROWS_WITH(parse_hf_config(dir.path / "config.json"), doctest::Contains("head_dim 131074 x 32768 heads != hidden_size 65536"));
  }
  { std::ofstream(dir.path / "config.json") << "{\"hidden_size\": 64}"; }
  expect_error("missing or non-integer 'intermediate_size'");
}

TEST_CASE("sampler: greedy, temperature, top-p and seeds") {
  const std::vector<float> logits{std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  CHECK(Sampler::argmax({1.0f, 3.0f, 3.0f, 2.0f}) == 1);
  Sampler greedy(0.0f, 1.0f, 1);
  CHECK(greedy.sample(logits) == 0);
  Sampler nucleus_tiny(1.0f, 1e-6f, 1);
  for (int i = 0; i < 100; ++i) CHECK(nucleus_tiny.sample(logits) == 0);
  // Temperature 1: the draws follow the softmax; top-p 0.7 keeps {0, 1} (mass 0.8), renormalised.
  const int n = 40000;
  std::vector<int> full(4), nucleus(4);
  Sampler a(1.0f, 1.0f, 7), b(1.0f, 0.7f, 7);
  for (int i = 0; i < n; ++i) {
    ++full[static_cast<std::size_t>(a.sample(logits))];
    ++nucleus[static_cast<std::size_t>(b.sample(logits))];
  }
  const double p[] = {0.5, 0.3, 0.15, 0.05}, q[] = {0.625, 0.375, 0, 0};
  for (int i = 0; i < 4; ++i) {
    CHECK(full[i] / double(n) == doctest::Approx(p[i]).epsilon(0.02).scale(1));
    CHECK(nucleus[i] / double(n) == doctest::Approx(q[i]).epsilon(0.02).scale(1));
  }
  // The same seed gives the same draws.
  Sampler c(0.8f, 0.9f, 42), d(0.8f, 0.9f, 42);
  for (int i = 0; i < 50; ++i) CHECK(c.sample(logits) == d.sample(logits));
  CHECK_THROWS_AS(Sampler(-1.0f, 1.0f, 1), Error);
  CHECK_THROWS_AS(Sampler(1.0f, 0.0f, 1), Error);
}

TEST_CASE("prefill once, decode under several managers: prefill_from continues exactly as a decoder that prefilled itself") {
  ThreadPool pool(2);
  const Model m = make_synthetic({"tiny", 11}, {}, pool);
  std::mt19937 rng(5);
  std::vector<int> prompt(203);
  for (int& t : prompt) t = static_cast<int>(rng() % static_cast<unsigned>(m.config.vocab));
  const std::vector<int> next = {3, 141, 59, 26, 5, 358, 97, 93};
  Config sparse = kv_config(m.config, Budget::fraction(0.25), 16);
  sparse.page_tokens = 4;
  const Config dense = kv_config(m.config, Budget::fraction(1.0));

  // Each manager type decodes `next` after the prompt: once after its own prefill, once after
  // prefill_from a snapshot another manager's decoder took.
  const auto decode = [&](auto& dec, const std::vector<float>& first) {
    std::vector<std::vector<float>> rows{first};
    for (int t : next) rows.push_back(dec.step(t));
    return rows;
  };
  PrefillSnapshot snap;
  std::vector<std::vector<float>> sparse_self, dense_self;
  {
    KvManager<index::Hierarchical, eviction::Lookahead> kv(sparse, {}, eviction::Lookahead{2});
    Decoder<decltype(kv)> dec(m, kv, pool, 48);
    dec.warm_up_after_prefill(8);
    dec.keep_prefill(&snap);
    sparse_self = decode(dec, dec.prefill(prompt));
  }
  CHECK(snap.tokens == 203);
  CHECK(snap.observed == 8);
  {
    KvManager<index::Dense, eviction::Lru> kv(dense);
    Decoder<decltype(kv)> dec(m, kv, pool, 48);
    dense_self = decode(dec, dec.prefill(prompt));
  }
  {
    KvManager<index::Hierarchical, eviction::Lookahead> kv(sparse, {}, eviction::Lookahead{2});
    Decoder<decltype(kv)> dec(m, kv, pool, 48);
    dec.warm_up_after_prefill(8);
    CHECK(decode(dec, dec.prefill_from(snap)) == sparse_self);  // bitwise: same K/V, same chunks, same warm-up
    CHECK(dec.position() == 203 + static_cast<std::int64_t>(next.size()));
  }
  {
    KvManager<index::Dense, eviction::Lru> kv(dense);
    Decoder<decltype(kv)> dec(m, kv, pool, 48);
    CHECK(decode(dec, dec.prefill_from(snap)) == dense_self);
    CHECK_THROWS_WITH_AS(dec.prefill_from(snap), doctest::Contains("already run"), Error);
  }
  // A snapshot of another shape is refused.
  const Model other =
      make_synthetic({"tiny", 11}, ShapeOverrides{.layers = 1, .heads = {}, .kv_heads = {}, .head_dim = {}, .hidden = {}, .vocab = {}}, pool);
  KvManager<index::Dense, eviction::Lru> kv(kv_config(other.config, Budget::fraction(1.0)));
  Decoder<decltype(kv)> dec(other, kv, pool);
  CHECK_THROWS_WITH_AS(dec.prefill_from(snap), doctest::Contains("does not fit"), Error);
}

TEST_CASE("teacher_force gives the logits at every position, as decoding token by token does") {
  ThreadPool pool(2);
  const Model m = make_synthetic({"tiny", 4}, {}, pool);
  std::vector<int> text(70);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<int>((i * 37 + 11) % static_cast<std::size_t>(m.config.vocab));
  const Config cfg = kv_config(m.config, Budget::fraction(1.0));
  KvManager<index::Dense, eviction::Lru> kv(cfg);
  Decoder<decltype(kv)> dec(m, kv, pool, 32);  // three chunks
  const auto rows = dec.teacher_force(text);
  REQUIRE(rows.size() == text.size());
  CHECK(rows.back() == dec.logits());
  KvManager<index::Dense, eviction::Lru> kv2(cfg);
  Decoder<decltype(kv2)> one(m, kv2, pool);
  std::vector<float> got = one.prefill(std::span<const int>(text.data(), 1));
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (i > 0) got = one.step(text[i]);
    double worst = 0;
    for (std::size_t j = 0; j < got.size(); ++j) worst = std::max(worst, static_cast<double>(std::abs(got[j] - rows[i][j])));
    INFO("position " << i);
    CHECK(worst < 1e-3);  // prefill's matrix products and blocked attention against decode's order
  }
}

TEST_CASE("BatchDecoder: sequences of different lengths decoded together give each sequence's own logits, bit for bit") {
  ThreadPool pool(2);
  const Model m = make_synthetic({"tiny", 8}, {}, pool);
  Config cfg = kv_config(m.config, Budget::fraction(0.25), 16);
  cfg.page_tokens = 4;
  const std::vector<std::size_t> lengths = {150, 37, 260};
  std::vector<std::vector<int>> prompts;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    std::vector<int> p(lengths[i]);
    for (std::size_t j = 0; j < p.size(); ++j) p[j] = static_cast<int>((j * 31 + 7 * i + 1) % static_cast<std::size_t>(m.config.vocab));
    prompts.push_back(p);
  }
  const int steps = 6;
  // Each alone, in a manager of its own, greedy.
  std::vector<std::vector<std::vector<float>>> alone(lengths.size());
  std::vector<std::vector<int>> tokens(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    KvManager<index::Hierarchical, eviction::Lookahead> kv(cfg, {}, eviction::Lookahead{2});
    Decoder<decltype(kv)> dec(m, kv, pool, 64);
    std::vector<float> l = dec.prefill(prompts[i]);
    for (int s = 0; s < steps; ++s) {
      tokens[i].push_back(static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin()));
      l = dec.step(tokens[i].back());
      alone[i].push_back(l);
    }
  }
  // Together, in one manager, fed the same tokens.
  KvManager<index::Hierarchical, eviction::Lookahead> kv(cfg, {}, eviction::Lookahead{2});
  BatchDecoder<decltype(kv)> batch(m, kv, pool, 64);
  for (const auto& p : prompts) batch.add().prefill(p);
  for (int s = 0; s < steps; ++s) {
    std::vector<int> t;
    for (std::size_t i = 0; i < lengths.size(); ++i) t.push_back(tokens[i][static_cast<std::size_t>(s)]);
    const auto& rows = batch.step(t);
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      INFO("step " << s << ", sequence " << i);
      CHECK(rows[i] == alone[i][static_cast<std::size_t>(s)]);
    }
  }
  for (std::size_t i = 0; i < lengths.size(); ++i) CHECK(batch[i].position() == static_cast<std::int64_t>(lengths[i]) + steps);
  CHECK(batch.steps() == steps);
  CHECK_THROWS_WITH_AS(batch.step(std::vector<int>{1, 2}), doctest::Contains("2 tokens for 3 sequences"), Error);
}

TEST_CASE("needle tasks: the number once, at the depth asked, within the token budget; answers are whole numbers") {
  if (!std::filesystem::is_directory("/usr/share/common-licenses")) {
    MESSAGE("SKIPPED: /usr/share/common-licenses is absent");
    return;
  }
  // Words stand in for tokens here: the task only needs a count that adds up over paragraphs.
  const auto words = [](const std::string& s) {
    std::int64_t n = 0;
    bool in = false;
    for (char ch : s) {
      const bool space = ch == ' ' || ch == '\n';
      n += !space && !in;
      in = !space;
    }
    return n;
  };
  for (const double depth : {0.0, 0.3, 1.0}) {
    const NeedleTask t = make_needle_task({1500, depth, 7}, words);
    INFO("depth " << depth);
    CHECK(t.answer.size() == 5);
    const std::string needle = "One of the special magic numbers is: " + t.answer + ".";
    const auto at = t.prompt.find(needle);
    REQUIRE(at != std::string::npos);
    CHECK(t.prompt.find(needle, at + 1) == std::string::npos);
    CHECK(t.document_tokens <= 1500);
    CHECK(t.document_tokens >= 1500 * 9 / 10);
    // The needle's place in words, against the depth asked (within one paragraph's length).
    const auto doc0 = t.prompt.find('\n') + 1;
    const double where = static_cast<double>(words(t.prompt.substr(doc0, at - doc0))) / static_cast<double>(t.document_tokens);
    CHECK(std::abs(where - depth) < 0.1);
    CHECK(t.needle_token == words(t.prompt.substr(doc0, at - doc0)));
  }
  CHECK(make_needle_task({1500, 0.5, 7}, words).answer == make_needle_task({900, 0.1, 7}, words).answer);  // the seed picks it
  CHECK_THROWS_WITH_AS(make_needle_task({1500, 1.5, 7}, words), doctest::Contains("depth"), Error);
  CHECK(reply_has(" is 12345.", "12345"));
  CHECK_FALSE(reply_has(" is 123456.", "12345"));
  CHECK_FALSE(reply_has(" is 912345", "12345"));
  CHECK(reply_has("912345 or 12345", "12345"));
}
