// Loader for Hugging Face Llama folders: config.json plus model.safetensors, or shards listed in
// model.safetensors.index.json. Honours num_key_value_heads, rope_theta, rope_scaling (llama3),
// rms_norm_eps, tie_word_embeddings and max_position_embeddings; RoPE is the rotate-half layout.
// fp32 tensors are used in place in the mapped files; fp16 and bf16 are converted to float.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kvdrive/core/error.hpp"
#include "kvdrive/core/half.hpp"
#include "model/model.hpp"
#include "model/safetensors.hpp"

namespace kvdrive::llama {

inline nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream f(path);
  KVD_EXPECT(f.good(), "{}: cannot open", path.string());
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
}

/// The model hyper-parameters from a Hugging Face config.json.
inline LlamaConfig parse_hf_config(const std::filesystem::path& path) {
  const nlohmann::json j = read_json(path);
  const std::string p = path.string();
  auto get_int = [&](const char* key) -> int {
    KVD_EXPECT(j.contains(key) && j[key].is_number_integer(), "{}: missing or non-integer '{}'", p, key);
    const auto v = j[key].get<std::int64_t>();
    KVD_EXPECT(v > 0 && v <= (std::int64_t{1} << 30), "{}: '{}' is {}, expected 1..2^30", p, key, v);
    return static_cast<int>(v);
  };
  auto positive = [&](double v, const char* key) {
    KVD_EXPECT(std::isfinite(v) && v > 0, "{}: '{}' is {}, expected a positive number", p, key, v);
    return v;
  };
  LlamaConfig c;
  try {
    c.dim = get_int("hidden_size");
    c.hidden_dim = get_int("intermediate_size");
    c.layers = get_int("num_hidden_layers");
    c.heads = get_int("num_attention_heads");
    c.kv_heads = j.contains("num_key_value_heads") ? get_int("num_key_value_heads") : c.heads;
    c.vocab = get_int("vocab_size");
    c.max_seq = j.contains("max_position_embeddings") ? get_int("max_position_embeddings") : 4096;
    c.rope_theta = positive(j.value("rope_theta", 10000.0), "rope_theta");
    c.rms_eps = static_cast<float>(positive(j.value("rms_norm_eps", 1e-5), "rms_norm_eps"));
    c.tied_embeddings = j.value("tie_word_embeddings", false);
    c.rope_layout = RopeLayout::half;
    if (j.contains("head_dim") && !j["head_dim"].is_null()) {
      // As int64: head_dim x heads in an int could wrap around to hidden_size (131074 x 32768 = 2^32 + 65536).
      const std::int64_t head_dim = get_int("head_dim");
      KVD_EXPECT(head_dim * c.heads == c.dim, "{}: head_dim {} x {} heads != hidden_size {} (unsupported)", p, head_dim, c.heads, c.dim);
    }
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
      const auto& rs = j["rope_scaling"];
      const std::string type = rs.value("rope_type", rs.value("type", std::string()));
      KVD_EXPECT(type == "llama3", "{}: rope_scaling type '{}' is not supported (only llama3)", p, type);
      c.rope_scaling.factor = positive(rs.at("factor").get<double>(), "rope_scaling.factor");
      c.rope_scaling.low_freq_factor = positive(rs.value("low_freq_factor", 1.0), "rope_scaling.low_freq_factor");
      c.rope_scaling.high_freq_factor = positive(rs.value("high_freq_factor", 4.0), "rope_scaling.high_freq_factor");
      c.rope_scaling.original_max_position =
          positive(rs.value("original_max_position_embeddings", 8192.0), "rope_scaling.original_max_position_embeddings");
      KVD_EXPECT(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor, "{}: rope_scaling.high_freq_factor must exceed low_freq_factor",
                 p);
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", p, e.what());
  }
  c.validate(p);
  return c;
}

namespace hf_loader_detail {

/// The safetensors files of a folder: the shards model.safetensors.index.json names (each once,
/// in the order first named), else model.safetensors.
inline std::vector<SafetensorsFile> open_safetensors(const std::filesystem::path& dir) {
  std::vector<SafetensorsFile> files;
  auto open = [&](const std::filesystem::path& p) { files.emplace_back(p.string()); };
  const auto index = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(index)) {
    const nlohmann::json j = read_json(index);
    KVD_EXPECT(j.contains("weight_map") && j["weight_map"].is_object(), "{}: missing 'weight_map'", index.string());
    std::vector<std::string> shards;
    for (auto& [name, shard] : j["weight_map"].items()) {
      KVD_EXPECT(shard.is_string(), "{}: weight_map['{}'] is not a file name", index.string(), name);
      const std::string s = shard.get<std::string>();
      KVD_EXPECT(s.find('/') == std::string::npos && s.find("..") == std::string::npos, "{}: shard name '{}' leaves the folder", index.string(), s);
      if (std::find(shards.begin(), shards.end(), s) == shards.end()) shards.push_back(s);
    }
    files.reserve(shards.size());
    for (const auto& s : shards) open(dir / s);
  } else {
    KVD_EXPECT(std::filesystem::exists(dir / "model.safetensors"), "{}: neither model.safetensors nor model.safetensors.index.json", dir.string());
    files.reserve(1);
    open(dir / "model.safetensors");
  }
  return files;
}

/// Takes a model's tensors from a folder's safetensors files, each checked against config.json
/// (its torch_dtype and the shape the sizes imply), then used in place (fp32) or converted.
class TensorReader {
 public:
  TensorReader(const std::filesystem::path& dir, const std::vector<SafetensorsFile>& files, Model& m) : dir_(dir), m_(m) {
    for (const auto& f : files)
      for (const auto& [name, info] : f.tensors()) where_[name] = {&info, f.path()};
    torch_dtype_ = read_json(dir / "config.json").value("torch_dtype", std::string());
    want_dtype_ = torch_dtype_ == "float32" ? "F32" : torch_dtype_ == "float16" ? "F16" : torch_dtype_ == "bfloat16" ? "BF16" : "";
  }

  std::size_t size() const { return where_.size(); }
  bool has(const std::string& name) const { return where_.count(name) != 0; }

  const float* tensor(const std::string& name, std::vector<std::int64_t> shape) {
    auto it = where_.find(name);
    KVD_EXPECT(it != where_.end(), "{}: tensor '{}' is missing", dir_.string(), name);
    const TensorInfo& t = *it->second.first;
    const std::string& file = it->second.second;
    KVD_EXPECT(want_dtype_.empty() || t.dtype == want_dtype_, "{}: tensor '{}' has dtype {} but config.json says torch_dtype {}", file, name, t.dtype,
               torch_dtype_);
    KVD_EXPECT(t.shape == shape, "{}: tensor '{}' has shape [{}], config.json implies [{}]", file, name, fmt::join(t.shape, ", "),
               fmt::join(shape, ", "));
    const auto n = static_cast<std::size_t>(t.elements());
    if (t.dtype == "F32") {
      if (reinterpret_cast<std::uintptr_t>(t.data) % alignof(float) == 0) return reinterpret_cast<const float*>(t.data);
      auto& v = m_.owned.emplace_back(n);
      std::memcpy(v.data(), t.data, n * sizeof(float));
      return v.data();
    }
    KVD_EXPECT(t.dtype == "F16" || t.dtype == "BF16", "{}: tensor '{}' has dtype {}, expected F32, F16 or BF16", file, name, t.dtype);
    auto& v = m_.owned.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t b;
      std::memcpy(&b, t.data + 2 * i, 2);
      v[i] = t.dtype == "F16" ? half_bits_to_float(b) : bf16_bits_to_float(b);
    }
    return v.data();
  }
  Matrix matrix(const std::string& name, std::int64_t rows, std::int64_t cols) { return Matrix::f32(tensor(name, {rows, cols}), rows, cols); }

 private:
  const std::filesystem::path& dir_;
  Model& m_;
  std::map<std::string, std::pair<const TensorInfo*, std::string>> where_;  // tensor -> (info, file)
  std::string torch_dtype_, want_dtype_;
};

}  // namespace hf_loader_detail

/// Loads a Hugging Face Llama folder.
inline Model load_hf(const std::filesystem::path& dir) {
  Model m;
  m.source = dir.string();
  m.config = parse_hf_config(dir / "config.json");
  const LlamaConfig& c = m.config;

  // The files and which one holds each tensor.
  const std::vector<SafetensorsFile> files = hf_loader_detail::open_safetensors(dir);
  // Each tensor: checked against config.json, then used in place (fp32) or converted.
  hf_loader_detail::TensorReader r(dir, files, m);
  std::vector<std::shared_ptr<MappedFile>> keep;
  for (const auto& f : files) keep.push_back(f.file());
  // owned vectors must not move while pointers into them are handed out
  m.owned.reserve(r.size() + 1);
  const std::int64_t D = c.dim, H = c.hidden_dim, KV = c.kv_dim(), V = c.vocab;
  m.token_embedding = r.matrix("model.embed_tokens.weight", V, D);
  for (int l = 0; l < c.layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    LayerWeights w;
    w.rms_att = r.tensor(pre + "input_layernorm.weight", {D});
    w.wq = r.matrix(pre + "self_attn.q_proj.weight", D, D);
    w.wk = r.matrix(pre + "self_attn.k_proj.weight", KV, D);
    w.wv = r.matrix(pre + "self_attn.v_proj.weight", KV, D);
    w.wo = r.matrix(pre + "self_attn.o_proj.weight", D, D);
    w.rms_ffn = r.tensor(pre + "post_attention_layernorm.weight", {D});
    w.w1 = r.matrix(pre + "mlp.gate_proj.weight", H, D);
    w.w2 = r.matrix(pre + "mlp.down_proj.weight", D, H);
    w.w3 = r.matrix(pre + "mlp.up_proj.weight", H, D);
    m.layers.push_back(w);
  }
  m.rms_final = r.tensor("model.norm.weight", {D});
  m.classifier = c.tied_embeddings || !r.has("lm_head.weight") ? m.token_embedding : r.matrix("lm_head.weight", V, D);
  KVD_EXPECT(c.tied_embeddings || r.has("lm_head.weight"), "{}: tensor 'lm_head.weight' is missing (tie_word_embeddings is false)", dir.string());
  m.files = std::move(keep);
  m.weight_types = "F32";
  return m;
}

}  // namespace kvdrive::llama
