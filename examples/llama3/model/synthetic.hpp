// Seeded synthetic Llama models of any shape ("synthetic:NAME[:seed=N]"), for runs and
// benchmarks without a checkpoint. Weights are Gaussian with 1/sqrt(fan-in) scale, norms are 1,
// RoPE is the Hugging Face layout with Llama-3's theta. Presets name a shape; ShapeOverrides
// change any of its sizes.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "kvdrive/eval/synthetic_spec.hpp"
#include "model/model.hpp"

namespace kvdrive::llama {

struct SyntheticPreset {
  std::string_view name;
  int dim, hidden, layers, heads, kv_heads, vocab;
  std::string_view about;
};

inline constexpr SyntheticPreset kSyntheticPresets[] = {
    {"tiny", 64, 172, 2, 8, 4, 512, "stories260K's shape"},
    {"small", 512, 1536, 4, 8, 2, 4096, "head_dim 64, GQA 4: long-context runs on a CPU"},
    {"smollm2-shape", 576, 1536, 30, 9, 3, 49152, "SmolLM2-135M's shape (random weights), for GPU runs where the file cannot go"},
    {"llama3-8b", 4096, 14336, 32, 32, 8, 128256, "Llama-3-8B's shape (32 GiB of fp32 weights)"},
    {"llama3-8b-layer", 4096, 14336, 1, 32, 8, 32000, "one Llama-3-8B layer, for benchmarks"},
};

struct ShapeOverrides {
  std::optional<int> layers, heads, kv_heads, head_dim, hidden, vocab;
};

using eval::SyntheticSpec;

/// "synthetic:NAME[:seed=N]" (eval::parse_synthetic_spec, as --model).
inline std::optional<SyntheticSpec> parse_synthetic(const std::string& model) { return eval::parse_synthetic_spec(model, "--model"); }

inline const SyntheticPreset& synthetic_preset(std::string_view name) {
  for (const auto& p : kSyntheticPresets)
    if (p.name == name) return p;
  std::string known;
  for (const auto& p : kSyntheticPresets) known += fmt::format("{}{}", known.empty() ? "" : ", ", p.name);
  fail("unknown synthetic model '{}' (known: {})", name, known);
}

/// A preset's shape with the overrides applied, and what every synthetic model shares: Llama-3's
/// RoPE theta in the Hugging Face layout, tied embeddings, a context of 4M tokens.
inline LlamaConfig synthetic_config(const SyntheticPreset& p, const ShapeOverrides& o) {
  LlamaConfig c;
  c.heads = o.heads.value_or(p.heads);
  c.kv_heads = o.kv_heads.value_or(p.kv_heads);
  const int head_dim = o.head_dim.value_or(p.dim / p.heads);
  c.dim = c.heads * head_dim;
  c.hidden_dim = o.hidden.value_or(p.hidden);
  c.layers = o.layers.value_or(p.layers);
  c.vocab = o.vocab.value_or(p.vocab);
  c.max_seq = 1 << 22;
  c.rope_theta = 500000.0;
  c.rope_layout = RopeLayout::half;
  c.rms_eps = 1e-5f;
  c.tied_embeddings = true;
  return c;
}

inline Model make_synthetic(const SyntheticSpec& spec, const ShapeOverrides& o, ThreadPool& pool) {
  Model m;
  m.config = synthetic_config(synthetic_preset(spec.preset), o);
  LlamaConfig& c = m.config;
  m.source = fmt::format("synthetic:{}:seed={}", spec.preset, spec.seed);
  c.validate(m.source);

  // Each tensor gets its own seed, so tensors can be generated in parallel and reproducibly.
  struct Job {
    std::vector<float>* dst;
    std::size_t n;
    float scale;  ///< 0: fill with ones
  };
  std::vector<Job> jobs;
  m.owned.reserve(2 + static_cast<std::size_t>(c.layers) * 9);
  auto tensor = [&](std::size_t n, float scale) {
    m.owned.emplace_back();
    jobs.push_back({&m.owned.back(), n, scale});
    return &m.owned.back();
  };
  const auto D = static_cast<std::size_t>(c.dim), H = static_cast<std::size_t>(c.hidden_dim), KV = static_cast<std::size_t>(c.kv_dim()),
             V = static_cast<std::size_t>(c.vocab);
  const float in_d = 1.0f / std::sqrt(static_cast<float>(D)), in_h = 1.0f / std::sqrt(static_cast<float>(H));
  auto* embed = tensor(V * D, 1.0f);
  auto* final_norm = tensor(D, 0.0f);
  struct LayerTensors {
    std::vector<float>*rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3;
  };
  std::vector<LayerTensors> lt;
  for (int l = 0; l < c.layers; ++l)
    lt.push_back({tensor(D, 0.0f), tensor(D * D, in_d), tensor(KV * D, in_d), tensor(KV * D, in_d), tensor(D * D, in_d), tensor(D, 0.0f),
                  tensor(H * D, in_d), tensor(D * H, in_h), tensor(H * D, in_d)});
  pool.parallel_for(jobs.size(), [&](std::size_t i) {
    const Job& j = jobs[i];
    j.dst->resize(j.n);
    if (j.scale == 0.0f) {
      std::fill(j.dst->begin(), j.dst->end(), 1.0f);
      return;
    }
    std::mt19937_64 rng(spec.seed * 1000003 + i);
    std::normal_distribution<float> n(0.0f, j.scale);
    for (auto& x : *j.dst) x = n(rng);
  });
  const auto Di = static_cast<std::int64_t>(D), Hi = static_cast<std::int64_t>(H), KVi = static_cast<std::int64_t>(KV);
  m.token_embedding = Matrix::f32(embed->data(), static_cast<std::int64_t>(V), Di);
  m.rms_final = final_norm->data();
  m.classifier = m.token_embedding;
  for (const auto& t : lt)
    m.layers.push_back({t.rms_att->data(), Matrix::f32(t.wq->data(), Di, Di), Matrix::f32(t.wk->data(), KVi, Di), Matrix::f32(t.wv->data(), KVi, Di),
                        Matrix::f32(t.wo->data(), Di, Di), t.rms_ffn->data(), Matrix::f32(t.w1->data(), Hi, Di), Matrix::f32(t.w2->data(), Di, Hi),
                        Matrix::f32(t.w3->data(), Hi, Di)});
  m.weight_types = "F32";
  return m;
}

}  // namespace kvdrive::llama
