// The GGUF reader and the llama loader from GGUF (examples/llama3/model/gguf.hpp, gguf_loader.hpp) on
// arbitrary bytes: the header, every metadata value (nested arrays too) through every getter that
// fits its type, every tensor's bytes (first and last), then read_vocab, gguf_llama_config and
// load_gguf. Each step may refuse the input with kvdrive::Error; the later ones still run.
#include "model/gguf_loader.hpp"
#include "harness.hpp"

namespace {

using namespace kvdrive::llama;

volatile unsigned sink;

template <class F>
void attempt(F&& f) {
  try {
    f();
  } catch (const kvdrive::Error&) {
  }
}

void touch(const GgufValue& v, unsigned& acc) {
  acc += static_cast<unsigned>(v.type_name().size() + v.to_string(3).size());
  if (v.is_integer()) attempt([&] { acc += static_cast<unsigned>(v.as_int()); });
  if (v.is_number()) acc += static_cast<unsigned>(v.as_double() != 0);
  if (v.is_string()) acc += static_cast<unsigned>(v.as_string().size());
  if (v.is_array()) v.for_each_item([&](const GgufValue& e) { touch(e, acc); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = kvdrive::fuzz::input_path(".gguf");
  return kvdrive::fuzz::with_file(path, data, size, [](const std::string& p) {
    const GgufFile f(p);
    unsigned acc = f.version() + static_cast<unsigned>(f.alignment());
    for (const GgufTensor& t : f.tensors()) {
      acc += static_cast<unsigned>(t.data[0]) + static_cast<unsigned>(t.data[t.bytes - 1]);
      acc += f.find_tensor(t.name) == &t;
    }
    for (const GgufKv& kv : f.metadata()) {
      touch(kv.value, acc);
      acc += f.find(kv.key) == &kv.value;
      attempt([&] { acc += static_cast<unsigned>(f.get_int(kv.key).value_or(0)); });
      attempt([&] { acc += static_cast<unsigned>(f.get_float(kv.key).value_or(0) != 0); });
      attempt([&] { acc += static_cast<unsigned>(f.get_string_array(kv.key).value_or(std::vector<std::string>{}).size()); });
      attempt([&] { acc += static_cast<unsigned>(f.get_int_array(kv.key).value_or(std::vector<std::int64_t>{}).size()); });
      attempt([&] { acc += static_cast<unsigned>(f.get_float_array(kv.key).value_or(std::vector<float>{}).size()); });
    }
    attempt([&] { acc += static_cast<unsigned>(read_vocab(f).tokens.size()); });
    attempt([&] { acc += static_cast<unsigned>(gguf_llama_config(f).dim); });
    attempt([&] { acc += static_cast<unsigned>(load_gguf(f).layers.size()); });
    sink = acc;
  });
}
