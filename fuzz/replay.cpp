// kvd-fuzz-replay TARGET PATH...: runs one fuzz target's harness (fuzz/<TARGET>.cpp, built here
// by the ordinary compiler, without libFuzzer) over every file under the PATHs: the committed
// corpus (fuzz/corpus/TARGET: inputs the fuzzers found interesting, crashes that were fixed)
// and the seeds kvd-fuzz-seeds writes. ctest runs it for every target in make test (and under
// ASan in CI), so an input that once found a bug stays a test. Exits 0 when every input ran (a
// kvdrive::Error is an answer); a crash, or an exception that is not a kvdrive::Error, fails.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

// Each harness defines LLVMFuzzerTestOneInput; here each gets its target's name instead.
#define LLVMFuzzerTestOneInput kvd_fuzz_llama2c
#include "fuzz_llama2c.cpp"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput kvd_fuzz_safetensors
#include "fuzz_safetensors.cpp"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput kvd_fuzz_hf_config
#include "fuzz_hf_config.cpp"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput kvd_fuzz_hf_index
#include "fuzz_hf_index.cpp"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput kvd_fuzz_tokenizer_llama2c
#include "fuzz_tokenizer_llama2c.cpp"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput kvd_fuzz_tokenizer_tiktoken
#include "fuzz_tokenizer_tiktoken.cpp"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput kvd_fuzz_trace
#include "fuzz_trace.cpp"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput kvd_fuzz_ssd_recover
#include "fuzz_ssd_recover.cpp"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput kvd_fuzz_args
#include "fuzz_args.cpp"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput kvd_fuzz_gguf
#include "fuzz_gguf.cpp"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput kvd_fuzz_tokenizer_gguf
#include "fuzz_tokenizer_gguf.cpp"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput kvd_fuzz_redis_url
#include "fuzz_redis_url.cpp"
#undef LLVMFuzzerTestOneInput

namespace {

using Harness = int (*)(const std::uint8_t*, std::size_t);

const std::map<std::string, Harness>& harnesses() {
  static const std::map<std::string, Harness> h{
      {"fuzz_llama2c", kvd_fuzz_llama2c},
      {"fuzz_safetensors", kvd_fuzz_safetensors},
      {"fuzz_hf_config", kvd_fuzz_hf_config},
      {"fuzz_hf_index", kvd_fuzz_hf_index},
      {"fuzz_tokenizer_llama2c", kvd_fuzz_tokenizer_llama2c},
      {"fuzz_tokenizer_tiktoken", kvd_fuzz_tokenizer_tiktoken},
      {"fuzz_trace", kvd_fuzz_trace},
      {"fuzz_ssd_recover", kvd_fuzz_ssd_recover},
      {"fuzz_args", kvd_fuzz_args},
      {"fuzz_gguf", kvd_fuzz_gguf},
      {"fuzz_tokenizer_gguf", kvd_fuzz_tokenizer_gguf},
      {"fuzz_redis_url", kvd_fuzz_redis_url},
  };
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || !harnesses().count(argv[1])) {
    std::fprintf(stderr, "usage: kvd-fuzz-replay TARGET PATH...  (TARGET: one of");
    for (const auto& [name, f] : harnesses()) std::fprintf(stderr, " %s", name.c_str());
    std::fprintf(stderr, ")\n");
    return 2;
  }
  const Harness run = harnesses().at(argv[1]);
  std::vector<std::filesystem::path> inputs;
  for (int i = 2; i < argc; ++i) {
    const std::filesystem::path p = argv[i];
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(p))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else if (std::filesystem::exists(p)) {
      inputs.push_back(p);
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "kvd-fuzz-replay %s: no inputs under the paths given\n", argv[1]);
    return 1;
  }
  std::sort(inputs.begin(), inputs.end());
  for (const auto& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      run(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {  // a kvdrive::Error is caught by the harness: this is a finding
      std::fprintf(stderr, "kvd-fuzz-replay %s: %s: %s\n", argv[1], p.c_str(), e.what());
      return 1;
    }
  }
  std::printf("kvd-fuzz-replay %s: %zu inputs ran\n", argv[1], inputs.size());
  return 0;
}
