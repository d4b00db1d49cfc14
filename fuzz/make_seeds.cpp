// kvd-fuzz-seeds DIR: writes a small, valid seed input for every fuzz target into DIR/<target>/,
// made with the formats' own rules (the trace with eval::TraceWriter), so that the fuzzers start
// from inputs that reach deep into the parsers rather than from nothing.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <algorithm>
#include <string>
#include <vector>

#include "kvdrive/core/config.hpp"
#include "kvdrive/eval/trace.hpp"
#include "ssd_store.hpp"

namespace fs = std::filesystem;

namespace {

void put(const fs::path& file, const std::string& bytes) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary) << bytes;
}

template <class T>
void append(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

/// A llama2.c checkpoint of a tiny model: dim 8, hidden 16, 1 layer, 2/2 heads, vocab 32, 16 positions.
std::string llama2c() {
  const std::int32_t D = 8, H = 16, L = 1, heads = 2, kv = 2, V = 32, S = 16, hd = D / heads, KV = kv * hd;
  std::string s;
  for (std::int32_t v : {D, H, L, heads, kv, V, S}) append(s, v);
  const std::int64_t floats = V * D + L * D + L * D * D + 2 * L * KV * D + L * D * D + L * D + 3 * L * H * D + D + S * hd;
  for (std::int64_t i = 0; i < floats; ++i) append(s, 0.01f * static_cast<float>(i % 17));
  return s;
}

std::string safetensors() {
  const std::string header = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"__metadata__":{"format":"pt"}})";
  std::string s;
  append(s, static_cast<std::uint64_t>(header.size()));
  s += header;
  for (int i = 0; i < 4; ++i) append(s, 1.0f + static_cast<float>(i));
  return s;
}

std::string hf_config() {
  return R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,)"
         R"("num_attention_heads":4,"num_key_value_heads":2,"vocab_size":300,"max_position_embeddings":256,"rms_norm_eps":1e-5,)"
         R"("rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,)"
         R"("original_max_position_embeddings":8192},"torch_dtype":"float32","tie_word_embeddings":false})";
}

/// A llama2.c tokenizer.bin of 259 tokens (the first byte of a fuzz input picks the vocabulary: 0 -> 259).
std::string tokenizer_llama2c() {
  std::string s(1, '\0');
  append(s, std::int32_t{6});
  auto token = [&](const std::string& piece, float score) {
    append(s, score);
    append(s, static_cast<std::int32_t>(piece.size()));
    s += piece;
  };
  token("<unk>", 0);
  token("<s>", 0);
  token("</s>", 0);
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    token(hex, 0);
  }
  return s;
}

/// tiktoken ranks: every single byte, then a few merges.
std::string tokenizer_tiktoken() {
  static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  auto encode = [&](const std::string& in) {
    std::string out;
    for (std::size_t i = 0; i < in.size(); i += 3) {
      const unsigned n = (static_cast<unsigned char>(in[i]) << 16) | (i + 1 < in.size() ? static_cast<unsigned char>(in[i + 1]) << 8 : 0) |
                         (i + 2 < in.size() ? static_cast<unsigned char>(in[i + 2]) : 0);
      out += b64[(n >> 18) & 63];
      out += b64[(n >> 12) & 63];
      out += i + 1 < in.size() ? b64[(n >> 6) & 63] : '=';
      out += i + 2 < in.size() ? b64[n & 63] : '=';
    }
    return out;
  };
  std::string s;
  int rank = 0;
  for (int b = 0; b < 256; ++b) s += encode(std::string(1, static_cast<char>(b))) + " " + std::to_string(rank++) + "\n";
  for (const char* merge : {"He", "ll", "llo", "Hello", " f", "uz", "zz"}) s += encode(merge) + " " + std::to_string(rank++) + "\n";
  return s;
}

/// A GGUF file of a tiny llama (dim 8, hidden 16, 1 layer, 2/1 heads, vocab 8, F32 weights, an F16
/// norm, rope_freqs) with a tokenizer, and a key of every other value type (a nested array too).
std::string gguf() {
  enum : std::uint32_t { u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, str = 8, arr = 9, u64 = 10, i64 = 11, f64 = 12 };
  const auto string = [](std::string& s, const std::string& v) {
    append(s, static_cast<std::uint64_t>(v.size()));
    s += v;
  };
  std::string kvs;
  std::uint64_t n_kv = 0;
  const auto key = [&](const std::string& k, std::uint32_t type) {
    string(kvs, k);
    append(kvs, type);
    ++n_kv;
  };
  const auto kv_u32 = [&](const std::string& k, std::uint32_t v) { key(k, u32), append(kvs, v); };
  const auto kv_str = [&](const std::string& k, const std::string& v) { key(k, str), string(kvs, v); };
  const auto kv_strs = [&](const std::string& k, const std::vector<std::string>& v) {
    key(k, arr), append(kvs, std::uint32_t{str}), append(kvs, static_cast<std::uint64_t>(v.size()));
    for (const auto& x : v) string(kvs, x);
  };
  const int D = 8, H = 16, heads = 2, kv_heads = 1, V = 8, hd = D / heads, KV = kv_heads * hd;
  kv_str("general.architecture", "llama");
  kv_u32("llama.block_count", 1);
  kv_u32("llama.context_length", 32);
  kv_u32("llama.embedding_length", D);
  kv_u32("llama.feed_forward_length", H);
  kv_u32("llama.attention.head_count", heads);
  kv_u32("llama.attention.head_count_kv", kv_heads);
  kv_u32("llama.rope.dimension_count", hd);
  key("llama.rope.freq_base", f32), append(kvs, 10000.0f);
  key("llama.attention.layer_norm_rms_epsilon", f32), append(kvs, 1e-5f);
  kv_str("tokenizer.ggml.model", "gpt2");
  kv_str("tokenizer.ggml.pre", "smollm");
  kv_strs("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "b", "ab", " ", "\xc4\xa0"});
  kv_strs("tokenizer.ggml.merges", {"a b"});
  key("tokenizer.ggml.scores", arr), append(kvs, std::uint32_t{f32}), append(kvs, std::uint64_t{V});
  for (int i = 0; i < V; ++i) append(kvs, -static_cast<float>(i));
  key("tokenizer.ggml.token_type", arr), append(kvs, std::uint32_t{i32}), append(kvs, std::uint64_t{V});
  for (int i = 0; i < V; ++i) append(kvs, std::int32_t{i < 3 ? 3 : 1});
  kv_u32("tokenizer.ggml.bos_token_id", 1);
  kv_u32("tokenizer.ggml.eos_token_id", 2);
  key("tokenizer.ggml.add_bos_token", boolean), append(kvs, std::uint8_t{1});
  kv_str("tokenizer.chat_template", "{{ messages }}");
  key("test.u8", u8), append(kvs, std::uint8_t{200});
  key("test.i8", i8), append(kvs, std::int8_t{-1});
  key("test.u16", u16), append(kvs, std::uint16_t{60000});
  key("test.i16", i16), append(kvs, std::int16_t{-2});
  key("test.u64", u64), append(kvs, ~std::uint64_t{0});
  key("test.i64", i64), append(kvs, std::int64_t{-3});
  key("test.f64", f64), append(kvs, 2.5);
  key("test.nested", arr), append(kvs, std::uint32_t{arr}), append(kvs, std::uint64_t{2});
  for (std::int32_t n : {1, 2}) {
    append(kvs, std::uint32_t{i32}), append(kvs, static_cast<std::uint64_t>(n));
    for (std::int32_t i = 0; i < n; ++i) append(kvs, i);
  }

  std::string infos, data;
  std::uint64_t n_tensors = 0;
  const auto tensor = [&](const std::string& name, std::vector<std::uint64_t> dims, std::uint32_t type) {
    std::uint64_t n = 1;
    for (auto d : dims) n *= d;
    string(infos, name);
    append(infos, static_cast<std::uint32_t>(dims.size()));
    for (auto d : dims) append(infos, d);
    append(infos, type);
    append(infos, static_cast<std::uint64_t>(data.size()));
    for (std::uint64_t i = 0; i < n; ++i) {
      if (type == 1) append(data, std::uint16_t{0x3c00});  // F16 1.0
      else append(data, 0.01f * static_cast<float>(i % 13) + (dims.size() == 1 ? 1.0f : 0.0f));
    }
    data.resize((data.size() + 31) / 32 * 32, '\0');
    ++n_tensors;
  };
  const std::uint64_t d = D, h = H, kv = KV, v = V;
  tensor("token_embd.weight", {d, v}, 0);
  tensor("rope_freqs.weight", {static_cast<std::uint64_t>(hd / 2)}, 0);
  tensor("blk.0.attn_norm.weight", {d}, 1);
  tensor("blk.0.attn_q.weight", {d, d}, 0);
  tensor("blk.0.attn_k.weight", {d, kv}, 0);
  tensor("blk.0.attn_v.weight", {d, kv}, 0);
  tensor("blk.0.attn_output.weight", {d, d}, 0);
  tensor("blk.0.ffn_norm.weight", {d}, 0);
  tensor("blk.0.ffn_gate.weight", {d, h}, 0);
  tensor("blk.0.ffn_down.weight", {h, d}, 0);
  tensor("blk.0.ffn_up.weight", {d, h}, 0);
  tensor("output_norm.weight", {d}, 0);

  std::string s = "GGUF";
  append(s, std::uint32_t{3});
  append(s, n_tensors);
  append(s, n_kv);
  s += kvs + infos;
  s.resize((s.size() + 31) / 32 * 32, '\0');  // the default alignment
  return s + data;
}

void trace(const fs::path& file) {
  fs::create_directories(file.parent_path());
  const kvdrive::ModelShape shape{1, 2, 1, 4};
  kvdrive::eval::TraceWriter w(file.string(), shape, kvdrive::DType::f16);
  std::vector<float> q(8), k(4), v(4);
  for (int p = 0; p < 6; ++p) {
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = 0.1f * static_cast<float>(p + static_cast<int>(i));
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = v[i] = 0.2f * static_cast<float>(p - static_cast<int>(i));
    w.write(0, p, q.data(), k.data(), v.data());
  }
  w.close();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kvd-fuzz-seeds DIR\n");
    return 2;
  }
  const fs::path dir = argv[1];
  put(dir / "fuzz_llama2c" / "tiny.bin", llama2c());
  put(dir / "fuzz_safetensors" / "one.safetensors", safetensors());
  put(dir / "fuzz_hf_config" / "config.json", hf_config());
  put(dir / "fuzz_tokenizer_llama2c" / "bytes.bin", tokenizer_llama2c());
  put(dir / "fuzz_tokenizer_tiktoken" / "ranks.model", tokenizer_tiktoken());
  trace(dir / "fuzz_trace" / "tiny.kvdtrace");
  {  // fuzz_ssd_recover: the intact log after its header (modes 0 and 2, sealed), and a small data patch (mode 1)
    const std::string store = (dir / "ssd_template.store").string();
    kvdrive::fuzz::write_store(store);
    std::ifstream log(store + ".log", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    put(dir / "fuzz_ssd_recover" / "log", std::string(1, '\0') + bytes.substr(std::min<std::size_t>(4096, bytes.size())));
    put(dir / "fuzz_ssd_recover" / "sealed-log", std::string(1, '\2') + bytes.substr(std::min<std::size_t>(4096, bytes.size())));
    put(dir / "fuzz_ssd_recover" / "patch", std::string("\x01\x00\x20\x00\x00xyz", 8));
    kvdrive::tier::SsdTier::remove_files(store);
  }
  put(dir / "fuzz_hf_index" / "index.json",
      R"({"metadata":{"total_size":16},"weight_map":{"model.embed_tokens.weight":"model-00001-of-00002.safetensors",)"
      R"("lm_head.weight":"model-00002-of-00002.safetensors"}})");
  put(dir / "fuzz_gguf" / "tiny.gguf", gguf());
  put(dir / "fuzz_args" / "plain", "synthetic:default");
  put(dir / "fuzz_args" / "seeded", "synthetic:small:seed=42");
  put(dir / "fuzz_redis_url" / "tcp", "redis://alice:p%40ss@[::1]:6380/2");
  put(dir / "fuzz_redis_url" / "unix", "unix:///run/redis/redis.sock?db=3");
  std::printf("kvd-fuzz-seeds: wrote seeds for 11 targets in %s\n", dir.c_str());
  return 0;
}
