// SmolLM2-135M-Instruct end to end against an independent reference: kvd-llama's decoder on the
// real GGUF (Q4_1 weights computed in their blocks, activations quantized per block) against an
// fp32 numpy forward pass over the same weights dequantized by the `gguf` package
// (scripts/make-reference-logits.py wrote tests/data/smollm2/reference.json). Skipped when the
// model is absent, failed under KVD_REQUIRE_MODEL=1.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "tokenizer/chat.hpp"
#include "decoder/decoder.hpp"
#include "model/gguf_loader.hpp"
#include "kvdrive/eval/recorded.hpp"
#include "kvdrive/eval/trace.hpp"
#include "kvdrive/kvdrive.hpp"
#include "model_files.hpp"
#include "app/needle.hpp"
#include "tokenizer/tokenizer.hpp"
#include "model/weights_f32.hpp"

using namespace kvdrive;
using namespace kvdrive::llama;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // a sanitizer build runs one case, a few greedy steps (time)
#else
constexpr bool kSanitized = false;
#endif

nlohmann::json reference() {
  std::ifstream f(test::test_data("smollm2/reference.json"));
  REQUIRE(f.good());
  return nlohmann::json::parse(f);
}

Config dense_f32(const LlamaConfig& c) {
  Config cfg;
  cfg.shape = {c.layers, c.heads, c.kv_heads, c.head_dim()};
  cfg.dtype = DType::f32;
  cfg.budget = Budget::fraction(1.0);
  return cfg;
}

int argmax(const std::vector<float>& v) { return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin()); }

/// How closely a decoder must follow the reference: every listed logit within `tolerance`, and
/// the reference's top-1 wherever its top-2 margin exceeds `margin` (a near-tie may go either way).
struct Bounds {
  double tolerance, margin;
};

struct Agreement {
  double worst = 0, sum = 0;
  std::size_t rows = 0, greedy_compared = 0, greedy_steps = 0;
};

void check_row(const std::vector<float>& ours, const nlohmann::json& ref, const Bounds& b, const std::string& where, Agreement& a) {
  const auto& ids = ref["ids"];
  const auto& lg = ref["logits"];
  double worst = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const double d = std::abs(ours[ids[i].get<std::size_t>()] - lg[i].get<double>());
    worst = std::max(worst, d);
    a.sum += d;
  }
  a.rows += ids.size();
  a.worst = std::max(a.worst, worst);
  INFO(where);
  CHECK(worst <= b.tolerance);
  // No logit outside the reference's top 8 may stand above its top-1 by more than the tolerance.
  CHECK(*std::max_element(ours.begin(), ours.end()) <= lg[0].get<double>() + b.tolerance);
  if (lg[0].get<double>() - lg[1].get<double>() > b.margin) CHECK(argmax(ours) == ids[0].get<int>());
}

/// Every reference case through the decoder on `m` with a dense f32 KV cache: teacher-forced
/// logits at every prompt position (decode path) and after each reference greedy token, the
/// prefill path's last logits, and free-running greedy decoding up to the first near-tie.
Agreement check_model(const Model& m, const Bounds& b) {
  const nlohmann::json ref = reference();
  REQUIRE(ref["cases"].size() >= 5);
  ThreadPool pool(2);
  Agreement a;
  int cases = 0;
  for (const auto& c : ref["cases"]) {
    if (kSanitized && cases > 0) break;
    ++cases;
    const std::string name = c["name"];
    const std::vector<int> ids = c["ids"].get<std::vector<int>>();
    const std::vector<int> want = c["greedy"].get<std::vector<int>>();
    KvManager<index::Dense, eviction::None> kv(dense_f32(m.config));
    Decoder<decltype(kv)> dec(m, kv, pool);
    const std::vector<float>* logits = &dec.prefill(std::span<const int>(ids.data(), 1));
    check_row(*logits, c["prompt_top"][0], b, name + " position 0", a);
    for (std::size_t p = 1; p < ids.size(); ++p) {
      logits = &dec.step(ids[p]);
      check_row(*logits, c["prompt_top"][p], b, name + " position " + std::to_string(p), a);
    }
    const std::size_t steps = kSanitized ? 4 : want.size();
    for (std::size_t s = 0; s < steps; ++s) {
      logits = &dec.step(want[s]);
      check_row(*logits, c["greedy_top"][s], b, name + " greedy step " + std::to_string(s), a);
    }

    // The prefill path (matrix products, blocked causal attention) on the whole prompt.
    KvManager<index::Dense, eviction::None> kv2(dense_f32(m.config));
    Decoder<decltype(kv2)> pre(m, kv2, pool, 16);
    check_row(pre.prefill(ids), c["prompt_top"][ids.size() - 1], b, name + " prefill", a);

    // Free-running greedy decoding: the reference's ids, up to the first step where the
    // reference's margin is within `margin` (none at all, for a tight enough bound).
    std::vector<int> got;
    const std::vector<float>* l = &pre.logits();
    for (std::size_t s = 0; s < steps; ++s) {
      const auto& top = s == 0 ? c["prompt_top"][ids.size() - 1] : c["greedy_top"][s - 1];
      if (top["logits"][0].get<double>() - top["logits"][1].get<double>() <= b.margin) break;
      got.push_back(argmax(*l));
      if (got.back() != want[s]) break;
      l = &pre.step(got.back());
    }
    INFO(name);
    CHECK(std::equal(got.begin(), got.end(), want.begin()));
    a.greedy_compared += got.size();
    a.greedy_steps += steps;
  }
  REQUIRE(a.rows > 0);
  MESSAGE("logits against the fp32 reference: largest difference " << a.worst << ", mean " << a.sum / static_cast<double>(a.rows) << "; greedy: "
                                                                   << a.greedy_compared << " of " << a.greedy_steps << " tokens compared");
  return a;
}

}  // namespace

TEST_CASE("SmolLM2, weights decoded to float: logits and greedy ids match the fp32 reference") {
  const auto path = test::smollm2_or_skip();
  if (!path) return;
  // Float activations over the exactly decoded blocks: only summation order separates this from
  // the reference (measured: at most 1.4e-4 on logits spanning about -10..35), so every greedy
  // token must agree, the reference's near-ties (down to a 0.003 margin) too.
  const Agreement a = check_model(with_f32_weights(load_gguf(path->string())), {1e-3, 1e-3});
  CHECK(a.greedy_compared == a.greedy_steps);
}

TEST_CASE("SmolLM2, weights in their Q4_1 blocks: logits and greedy ids within the activations' 16-bit rounding of the reference") {
  const auto path = test::smollm2_or_skip();
  if (!path) return;
  // Activations are quantized to int16 per 32-value block (quant_dot.hpp). Measured over every
  // row of the reference (top-8 logits, prompt and greedy positions): at most 0.0070 from it,
  // 0.0011 on average. With int8 activations, as llama.cpp computes (llama-cpp-python 0.3.36,
  // f32 KV), the differences were at most 1.52 and 0.252 on average (llama.cpp: 1.68, 0.259),
  // and greedy decoding left the reference at its near-ties: on the chat prompt "L'..." for "The
  // capital of France is Paris." (a 0.08 margin), on bsd after 7 tokens (0.03), lgpl3-defs
  // after 8 (0.07). Now top-1 is asserted wherever the reference's margin exceeds 0.02: free
  // running greedy decoding keeps the reference's ids up to its first margin within 0.02 (apache
  // 0.006 at token 22, gpl3 0.011 at token 16), all 24 on the three other prompts: 110 of 120.
  const Agreement a = check_model(load_gguf(path->string()), {0.02, 0.02});
  CHECK(a.sum / static_cast<double>(a.rows) < 0.003);
  if (!kSanitized) CHECK(a.greedy_compared >= 110);
}

TEST_CASE("SmolLM2: the GGUF tokenizer gives llama.cpp's ids for the reference prompts") {
  const auto path = test::smollm2_or_skip();
  if (!path) return;
  const Model m = load_gguf(path->string());
  REQUIRE(m.vocab != nullptr);
  const Tokenizer tok(*m.vocab);
  const nlohmann::json ref = reference();  // kept alive: a range-for over reference()["cases"] would outlive the temporary
  for (const auto& c : ref["cases"]) {
    const std::string text = c["text"];
    const std::vector<int> ids = c["ids"].get<std::vector<int>>();
    INFO(c["name"].get<std::string>());
    CHECK_FALSE(tok.adds_bos(text));  // SmolLM2's tokenizer.ggml.add_bos_token is false
    CHECK(tok.encode(text, false, true) == ids);
  }
}

TEST_CASE("SmolLM2: the chat prompt kvd-llama renders is the GGUF template's, as the reference prompt") {
  const auto path = test::smollm2_or_skip();
  if (!path) return;
  const Model m = load_gguf(path->string());
  const ChatTemplate t = ChatTemplate::from_gguf(m.vocab->chat_template);
  CHECK(t.format == ChatFormat::chatml);
  CHECK(t.default_system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  const nlohmann::json ref = reference();
  for (const auto& c : ref["cases"])
    if (c["name"] == "chat") CHECK(t.render({{"user", "What is the capital of France?"}}) == c["text"].get<std::string>());
  CHECK(t.render({{"system", "Be brief."}, {"user", "Hi"}}, "Hello") ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello");
}

TEST_CASE("SmolLM2, real attention: MeanKey, Centroid and ProductQuant at their defaults select differently") {
  // Centroid clustered only whole segments of 1,024 pages and ProductQuant trained only at 1,024
  // pages, scoring exact means until then, so below 8K tokens both were MeanKey bit for bit on
  // every real prompt. At their defaults (segments of 128 pages; an interim codebook from 128
  // pages) each is itself from 1K tokens. Measured on this prompt: the three pairs choose
  // different page sets at 116 to 120 of 120 selections; before, at none.
  const auto path = test::smollm2_or_skip();
  if (!path) return;
  const Model m = load_gguf(path->string());
  REQUIRE(m.vocab != nullptr);
  const Tokenizer tok(*m.vocab);
  std::string text;
  for (const std::string& para : haystack_paragraphs(NeedleSpec{}.dir)) {
    text += para + "\n\n";
    if (text.size() > 8000) break;
  }
  std::vector<int> ids = tok.encode(text, false);
  if (kSanitized) {
    MESSAGE("SKIPPED under a sanitizer (a 1,100-token prefill takes minutes there)");
    return;
  }
  const std::size_t prompt = 1100;
  REQUIRE(ids.size() >= prompt);
  ids.resize(prompt);

  // The prompt's Q, K and V, recorded as kvd-llama --record-trace does.
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "kvd_test_smollm2_indices.trace";
  {
    ThreadPool pool(2);
    KvManager<index::Dense, eviction::None> kv(dense_f32(m.config));
    Decoder<decltype(kv)> dec(m, kv, pool);
    eval::TraceWriter trace(file.string(), kv.config().shape, DType::f32);
    dec.record(&trace);
    dec.prefill(ids);
    trace.close();
  }
  const int steps = 8, page_tokens = 8;
  const eval::RecordedTrace tr(file.string(), steps);
  const ModelShape& shape = tr.shape();
  index::MeanKey mean_key;
  index::Centroid centroid;
  index::ProductQuant pq;
  int selections = 0, mean_centroid = 0, mean_pq = 0, centroid_pq = 0;
  for (int layer = 0; layer < shape.layers; layer += 7)
    for (int h = 0; h < shape.kv_heads; ++h) {
      const eval::StreamTrace st = tr.stream(layer, h);
      const std::int64_t pages = st.prefix / page_tokens;
      const index::PageKeys keys{st.keys.data(), 0, pages, page_tokens, st.head_dim, DType::f32};
      index::MeanKey::State ms;
      index::Centroid::State cs;
      index::ProductQuant::State ps;
      mean_key.build(ms, keys);
      centroid.build(cs, keys);
      pq.build(ps, keys);
      REQUIRE(cs.clustered > 0);  // the first segment is clustered
      REQUIRE(ps.trained());
      for (int s = 0; s < steps; ++s) {
        index::IndexQuery q{st.queries.data() + static_cast<std::size_t>(s) * st.group * st.head_dim,
                            st.group,
                            st.head_dim,
                            1.0f / std::sqrt(static_cast<float>(st.head_dim)),
                            1,
                            pages - 8,
                            0};
        q.budget_pages = (q.candidates() + 15) / 16;  // 6.25%
        std::vector<std::uint32_t> a, b, c;
        mean_key.select(ms, q, a);
        centroid.select(cs, q, b);
        pq.select(ps, q, c);
        for (const auto* sel : {&a, &b, &c}) CHECK(static_cast<std::int64_t>(sel->size()) == q.budget_pages);
        ++selections;
        mean_centroid += a != b;
        mean_pq += a != c;
        centroid_pq += b != c;
      }
    }
  MESSAGE(selections << " selections on " << prompt << " real tokens: MeanKey vs Centroid differ in " << mean_centroid
                     << ", MeanKey vs ProductQuant in " << mean_pq << ", Centroid vs ProductQuant in " << centroid_pq);
  CHECK(2 * mean_centroid > selections);
  CHECK(2 * mean_pq > selections);
  CHECK(2 * centroid_pq > selections);
  std::filesystem::remove(file);
}
