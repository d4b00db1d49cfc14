// A Hugging Face folder's model.safetensors.index.json (examples/llama3/model/hf_loader.hpp) on
// arbitrary bytes, next to a fixed, valid config.json: the weight map, its shard names (which
// must not leave the folder) and the shards they name.
#include <filesystem>
#include <fstream>

#include "harness.hpp"
#include "model/hf_loader.hpp"

namespace {

std::filesystem::path make_folder() {
  const std::filesystem::path dir = kvdrive::fuzz::input_path("_hf");
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"hidden_size":64,"intermediate_size":128,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2,)"
         R"("vocab_size":300,"max_position_embeddings":256,"rms_norm_eps":1e-5,"rope_theta":10000.0,"torch_dtype":"float32"})";
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path dir = make_folder();
  return kvdrive::fuzz::with_file((dir / "model.safetensors.index.json").string(), data, size,
                                  [](const std::string&) { (void)kvdrive::llama::load_hf(dir); });
}
