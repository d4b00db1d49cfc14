// The GGUF reader (examples/llama3/model/gguf.hpp) and the llama loader from GGUF (gguf_loader.hpp).
// The fixtures and their expectations (tests/data/gguf/fixtures.json: values, types, shapes,
// offsets and sha256 of the tensors' bytes) come from scripts/make-gguf-fixtures.py, which wrote
// the files with gguf-py's GGUFWriter and read them back with its GGUFReader; what the reader
// gives is checked against what the writer was given. The files are committed as text
// (tests/data/gguf/<name>.gguf.json) and written back here (tests/gguf_fixtures.hpp), byte for
// byte those gguf-py wrote (their sha256 is checked). Bad files are made by editing the bytes of
// those fixtures (or, for metadata the fixtures lack, with the small byte builder below) and
// must give kvdrive::Error, never a crash.
#include <doctest/doctest.h>

#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gguf.hpp"
#include "gguf_fixtures.hpp"
#include "model/gguf_loader.hpp"
#include "model_files.hpp"
#include "sha256.hpp"

namespace {

using namespace kvdrive::llama;
using kvdrive::test::sha256;
using nlohmann::json;
namespace fs = std::filesystem;

#define CHECK_CONTAINS(text, part) CHECK_MESSAGE(std::string(text).find(part) != std::string::npos, "'" << (text) << "' lacks '" << (part) << "'")

std::string hex(std::string_view s) {
  std::string out;
  for (unsigned char c : s) out += fmt::format("{:02x}", c);
  return out;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << p.string() << " (run scripts/make-gguf-fixtures.py)");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const json& fixtures() {
  static const json j = json::parse(read_bytes(kvdrive::test::test_data("gguf/fixtures.json")));
  return j;
}

/// A fixture ("values.gguf", ...): the file written from its text form, once per run.
std::string fixture_path(const char* name) { return kvdrive::test::gguf_fixture(std::string("gguf/") + name).string(); }

/// A file in TMPDIR holding some bytes, removed when it goes.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& bytes, const char* suffix = ".gguf") {
    static int counter = 0;
    path = (fs::temp_directory_path() / fmt::format("kvd_test_gguf_{}_{}{}", ::getpid(), counter++, suffix)).string();
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
};

/// The message of the kvdrive::Error f throws (a failure if it throws nothing).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kvdrive::Error& e) {
    return e.what();
  }
  FAIL("expected a kvdrive::Error");
  return {};
}

std::string open_error(const std::string& bytes) {
  const TempFile t(bytes);
  const std::string msg = error_of([&] { GgufFile f(t.path); });
  CHECK_MESSAGE(msg.rfind(t.path, 0) == 0, "the message does not start with the path: " << msg);
  return msg;
}

template <class T>
void put(std::string& bytes, std::size_t at, T v) {
  REQUIRE(at + sizeof v <= bytes.size());
  std::memcpy(bytes.data() + at, &v, sizeof v);
}

template <class T>
T get(const std::string& bytes, std::size_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;
}

const json& entry(const json& list, const std::string& field, const std::string& value) {
  for (const json& e : list)
    if (e.at(field) == value) return e;
  FAIL("no entry with " << field << " " << value);
  static const json none;
  return none;
}

/// Byte offsets inside a tensor info (the format's layout), from where the info starts.
struct InfoAt {
  std::size_t n_dims, dims, type, offset;
};
InfoAt info_at(const json& t) {
  const std::size_t io = t.at("info_offset").get<std::size_t>() + 8 + t.at("name").get<std::string>().size();
  const std::size_t nd = t.at("dims").size();
  return {io, io + 4, io + 4 + 8 * nd, io + 4 + 8 * nd + 4};
}

/// Where a metadata value starts (after its key and type), from the key's offset.
std::size_t value_at(const json& kv) { return kv.at("offset").get<std::size_t>() + 8 + kv.at("key").get<std::string>().size() + 4; }

/// Compares a value with what the script wrote (strings as hex of their bytes).
void check_value(const GgufValue& v, const json& want, const std::string& key) {
  INFO("key " << key << " (" << v.type_name() << ")");
  if (v.is_string()) {
    CHECK(hex(v.as_string()) == want.get<std::string>());
  } else if (v.is_bool()) {
    CHECK(v.as_bool() == want.get<bool>());
  } else if (v.type == GgufValueType::uint64) {
    CHECK(v.as_uint() == want.get<std::uint64_t>());
  } else if (v.is_integer()) {
    CHECK(v.as_int() == want.get<std::int64_t>());
  } else if (v.is_float()) {
    CHECK(v.as_double() == want.get<double>());  // float32 values were written as the float32 they round to
  } else {
    REQUIRE(v.is_array());
    REQUIRE(want.is_array());
    REQUIRE(v.length == want.size());
    const std::vector<GgufValue> items = v.items();
    REQUIRE(items.size() == want.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      CHECK(items[i].type == v.element_type);
      check_value(items[i], want[i], key + "[" + std::to_string(i) + "]");
    }
  }
}

/// Checks a file's tensors against the script's record of them.
void check_tensors(const GgufFile& f, const json& e) {
  REQUIRE(f.tensors().size() == e.at("tensors").size());
  for (std::size_t i = 0; i < f.tensors().size(); ++i) {
    const json& want = e.at("tensors")[i];
    const GgufTensor& t = f.tensors()[i];
    INFO("tensor " << want.at("name").get<std::string>());
    CHECK(t.name == want.at("name").get<std::string>());
    CHECK(f.find_tensor(t.name) == &t);
    CHECK(ggml_type_name(t.type) == want.at("type").get<std::string>());
    CHECK(t.dims == want.at("dims").get<std::vector<std::int64_t>>());
    CHECK(t.offset == want.at("offset").get<std::uint64_t>());
    CHECK(t.bytes == want.at("bytes").get<std::size_t>());
    CHECK(t.data == f.file()->data() + want.at("file_offset").get<std::size_t>());
    CHECK(t.offset % f.alignment() == 0);
    CHECK(sha256(t.data, t.bytes) == want.at("sha256").get<std::string>());
  }
}

// --- a small GGUF byte builder, for metadata the fixtures do not have ---

std::string u32(std::uint32_t v) { return {reinterpret_cast<const char*>(&v), 4}; }
std::string u64(std::uint64_t v) { return {reinterpret_cast<const char*>(&v), 8}; }
std::string f32(float v) { return {reinterpret_cast<const char*>(&v), 4}; }
std::string str(std::string_view s) { return u64(s.size()) + std::string(s); }
std::string kv(std::string_view key, GgufValueType type, const std::string& payload) {
  return str(key) + u32(static_cast<std::uint32_t>(type)) + payload;
}
std::string kv_u32(std::string_view key, std::uint32_t v) { return kv(key, GgufValueType::uint32, u32(v)); }
std::string kv_f32(std::string_view key, float v) { return kv(key, GgufValueType::float32, f32(v)); }
std::string kv_str(std::string_view key, std::string_view v) { return kv(key, GgufValueType::string, str(v)); }
std::string kv_str_array(std::string_view key, const std::vector<std::string>& v) {
  std::string p = u32(static_cast<std::uint32_t>(GgufValueType::string)) + u64(v.size());
  for (const auto& s : v) p += str(s);
  return kv(key, GgufValueType::array, p);
}
/// A file of metadata only (no tensors).
std::string metadata_file(const std::vector<std::string>& kvs) {
  std::string s = "GGUF" + u32(3) + u64(0) + u64(kvs.size());
  for (const auto& k : kvs) s += k;
  return s;
}
/// The metadata of a llama model: dim 64, hidden 128, 2 layers, 4/2 heads, 512 positions, vocab 100.
std::vector<std::string> llama_keys() {
  return {kv_str("general.architecture", "llama"), kv_u32("llama.embedding_length", 64),    kv_u32("llama.feed_forward_length", 128),
          kv_u32("llama.block_count", 2),          kv_u32("llama.attention.head_count", 4), kv_u32("llama.attention.head_count_kv", 2),
          kv_u32("llama.context_length", 512),     kv_u32("llama.vocab_size", 100)};
}
LlamaConfig config_of(const std::vector<std::string>& kvs) {
  const TempFile t(metadata_file(kvs));
  return gguf_llama_config(GgufFile(t.path));
}
std::string config_error(const std::vector<std::string>& kvs) {
  const TempFile t(metadata_file(kvs));
  return error_of([&] { gguf_llama_config(GgufFile(t.path)); });
}
std::vector<std::string> without(std::vector<std::string> kvs, std::string_view key) {
  std::erase_if(kvs, [&](const std::string& k) { return k.compare(8, key.size(), key) == 0 && get<std::uint64_t>(k, 0) == key.size(); });
  return kvs;
}
std::vector<std::string> with(std::vector<std::string> kvs, const std::string& extra) {
  kvs.push_back(extra);
  return kvs;
}

}  // namespace

TEST_CASE("GGUF: the fixtures written from their text form are the files gguf-py wrote") {
  for (const char* name : {"values", "v2", "align64", "llama_tied", "llama_output"}) {
    CAPTURE(name);
    const json& e = fixtures().at(name);
    const std::string file = e.at("file").get<std::string>();
    const json text = kvdrive::test::read_gguf_text(kvdrive::test::test_data("gguf/" + file + ".json"));
    CHECK(text.at("file") == file);
    const std::string bytes = read_bytes(fixture_path(file.c_str()));  // its sha256 is checked as it is written
    CHECK(sha256(bytes) == text.at("sha256").get<std::string>());
    CHECK(bytes.size() == e.at("size").get<std::size_t>());
    CHECK(get<std::uint32_t>(bytes, 4) == e.at("version").get<std::uint32_t>());
  }
}

TEST_CASE("GGUF: every metadata value type and tensor type reads back as the script wrote it") {
  const json& e = fixtures().at("values");
  const GgufFile f(fixture_path("values.gguf"));
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.data_offset() == e.at("data_offset").get<std::uint64_t>());
  CHECK(f.file()->size() == e.at("size").get<std::size_t>());

  // Every key, in file order, with its type and value.
  const json& kvs = e.at("kv");
  REQUIRE(f.metadata().size() == kvs.size());
  for (std::size_t i = 0; i < kvs.size(); ++i) {
    const GgufKv& got = f.metadata()[i];
    const std::string key = kvs[i].at("key");
    CHECK(got.key == key);
    CHECK(got.offset == kvs[i].at("offset").get<std::size_t>());
    CHECK(got.value.type_name() == kvs[i].at("type").get<std::string>());
    CHECK(f.has(key));
    CHECK(f.find(key) == &got.value);
    check_value(got.value, kvs[i].at("value"), key);
  }
  // Nested arrays keep their element types.
  const std::vector<GgufValue> nested = f.find("test.nested_i32")->items();
  REQUIRE(nested.size() == 2);
  CHECK(nested[0].type_name() == "array[int32; 2]");
  CHECK(nested[1].type_name() == "array[int32; 1]");
  CHECK(f.find("test.nested_str")->items()[0].type_name() == "array[string; 2]");
  CHECK(f.find("test.nested3")->items()[1].items()[0].type_name() == "array[float32; 2]");

  // The typed getters.
  const auto want = [&](const char* key) -> const json& { return entry(kvs, "key", key).at("value"); };
  for (const char* key : {"test.u8", "test.i8", "test.u16", "test.i16", "test.u32", "test.i32", "test.i64", "test.i64_small"})
    CHECK(f.get_int(key) == want(key).get<std::int64_t>());
  CHECK(f.get_uint("test.u64") == want("test.u64").get<std::uint64_t>());
  CHECK_CONTAINS(error_of([&] { (void)f.get_int("test.u64"); }), "past the int64 range");
  CHECK_CONTAINS(error_of([&] { (void)f.get_uint("test.i8"); }), "expected a non-negative integer");
  CHECK(f.get_float("test.f32") == want("test.f32").get<double>());
  CHECK(f.get_float("test.f64") == want("test.f64").get<double>());
  CHECK(f.get_float("test.u16") == 60000.0);  // integers are numbers too
  CHECK(f.get_bool("test.bool_true") == true);
  CHECK(f.get_bool("test.bool_false") == false);
  CHECK(hex(*f.get_string("test.bytes")) == want("test.bytes").get<std::string>());
  CHECK(f.get_string("test.bytes")->size() == 6);  // a NUL inside: strings are bytes
  CHECK(f.get_string("test.empty") == "");
  CHECK(hex(f.require_string("test.utf8")) == want("test.utf8").get<std::string>());
  const std::vector<std::string> strings = *f.get_string_array("test.arr_string");
  REQUIRE(strings.size() == want("test.arr_string").size());
  for (std::size_t i = 0; i < strings.size(); ++i) CHECK(hex(strings[i]) == want("test.arr_string")[i].get<std::string>());
  const std::vector<float> floats = *f.get_float_array("test.arr_f32");
  REQUIRE(floats.size() == want("test.arr_f32").size());
  for (std::size_t i = 0; i < floats.size(); ++i) CHECK(floats[i] == want("test.arr_f32")[i].get<float>());
  CHECK(f.get_int_array("test.arr_i16") == want("test.arr_i16").get<std::vector<std::int64_t>>());
  CHECK(f.get_int_array("test.arr_u8") == std::vector<std::int64_t>{0, 1, 255});
  CHECK(f.get_int_array("test.arr_i64") == want("test.arr_i64").get<std::vector<std::int64_t>>());
  CHECK_CONTAINS(error_of([&] { (void)f.get_int_array("test.arr_u64"); }), "past the int64 range");

  // Absent keys, wrong types.
  CHECK_FALSE(f.has("test.absent"));
  CHECK(f.find("test.absent") == nullptr);
  CHECK_FALSE(f.get_int("test.absent").has_value());
  CHECK_FALSE(f.get_string_array("test.absent").has_value());
  const std::string missing = error_of([&] { (void)f.require_int("test.absent"); });
  CHECK_CONTAINS(missing, "'test.absent'");
  CHECK_CONTAINS(missing, "is missing");
  const std::string wrong = error_of([&] { (void)f.get_int("test.string"); });
  CHECK_CONTAINS(wrong, fixture_path("values.gguf"));
  CHECK_CONTAINS(wrong, "metadata 'test.string' is string, expected an integer");
  CHECK_CONTAINS(error_of([&] { (void)f.get_string_array("test.arr_i32"); }), "is array[int32; 3], expected an array of strings");
  CHECK_CONTAINS(error_of([&] { (void)f.get_float_array("test.arr_string"); }), "expected an array of numbers");
  CHECK_CONTAINS(error_of([&] { (void)f.get_bool("test.u8"); }), "is uint8, expected a bool");
  CHECK_CONTAINS(error_of([&] { (void)f.get_string("test.arr_u8"); }), "expected a string");

  // Display (what a --dump prints).
  CHECK(f.find("test.arr_u8")->to_string() == "[0, 1, 255]");
  CHECK(f.find("test.nested_i32")->to_string() == "[[1, 2], [3]]");
  CHECK(f.find("test.bytes")->to_string() == "'\\xff\\x00raw\\x80'");
  CHECK(f.find("test.bool_true")->to_string() == "true");
  CHECK(f.find("test.u64")->to_string() == "18446744073709551615");
  CHECK(f.find("test.arr_i16")->to_string(2).find(", ... (300 items)]") != std::string::npos);

  check_tensors(f, e);
  const GgufTensor* q = f.find_tensor("q8_0");
  REQUIRE(q != nullptr);
  CHECK(q->cols() == 64);
  CHECK(q->rows() == 2);
  CHECK(q->elements == 128);
  CHECK(q->shape() == "[64, 2]");
  CHECK(f.find_tensor("i32.4d")->dims.size() == 4);
  CHECK(f.find_tensor("absent") == nullptr);
}

TEST_CASE("GGUF: version 2 files and an alignment of 64") {
  {
    const json& e = fixtures().at("v2");
    const GgufFile f(fixture_path("v2.gguf"));
    CHECK(f.version() == 2);
    CHECK(f.get_int("test.answer") == 42);
    CHECK(f.get_string("test.s") == "version two");
    check_tensors(f, e);
  }
  {
    const json& e = fixtures().at("align64");
    const GgufFile f(fixture_path("align64.gguf"));
    CHECK(f.alignment() == 64);
    CHECK(f.get_int("general.alignment") == 64);
    CHECK(f.data_offset() == e.at("data_offset").get<std::uint64_t>());
    CHECK(f.data_offset() % 64 == 0);
    check_tensors(f, e);  // offsets multiples of 64
    REQUIRE(f.tensors().size() == 3);
    CHECK(f.tensors()[1].offset == 64);  // a 12-byte tensor, then padding to 64

    // A bad alignment: not a power of two, zero, or too large.
    const std::string good = read_bytes(fixture_path("align64.gguf"));
    const std::size_t at = value_at(entry(e.at("kv"), "key", "general.alignment"));
    REQUIRE(get<std::uint32_t>(good, at) == 64);
    for (std::uint32_t bad : {48u, 0u, 3u}) {
      std::string b = good;
      put(b, at, bad);
      const std::string msg = open_error(b);
      CHECK_CONTAINS(msg, "general.alignment is " + std::to_string(bad) + ", expected a power of two");
    }
  }
}

TEST_CASE("GGUF: a bad header, a truncated file or bad metadata gives a clear kvdrive::Error") {
  const json& e = fixtures().at("values");
  const std::string good = read_bytes(fixture_path("values.gguf"));
  REQUIRE(good.size() == e.at("size").get<std::size_t>());
  const json& kvs = e.at("kv");

  SUBCASE("magic and version") {
    std::string b = good;
    b[0] = 'X';
    CHECK_CONTAINS(open_error(b), "not a GGUF file: the magic bytes are 58 47 55 46, expected 47 47 55 46");
    for (std::uint32_t v : {1u, 4u, 0u, 0x03000000u}) {
      b = good;
      put(b, 4, v);
      const std::string msg = open_error(b);
      if (v == 1) CHECK_CONTAINS(msg, "GGUF version 1 is not supported");
      if (v == 4) CHECK_CONTAINS(msg, "GGUF version 4 is not supported; expected version 2 or 3");
      if (v == 0x03000000u) CHECK_CONTAINS(msg, "big-endian");
    }
    CHECK_CONTAINS(open_error(""), "too short for a GGUF file");
    CHECK_CONTAINS(open_error("GGU"), "too short for a GGUF file");
  }

  SUBCASE("every truncation fails, short of only the padding after the last tensor") {
    const std::size_t data_end = e.at("data_end").get<std::size_t>();
    const TempFile t("");
    for (std::size_t n = 0; n <= good.size(); ++n) {
      std::ofstream(t.path, std::ios::binary | std::ios::trunc).write(good.data(), static_cast<std::streamsize>(n));
      if (n < data_end) {
        INFO("prefix of " << n << " bytes");
        CHECK_THROWS_AS(GgufFile{t.path}, kvdrive::Error);
      } else {
        const GgufFile f(t.path);
        CHECK(f.tensors().size() == e.at("tensors").size());
      }
    }
    CHECK_CONTAINS(open_error(good.substr(0, 30)),
                   fmt::format("the header claims {} metadata keys, but the 6 bytes after it hold at most 0", kvs.size()));
    const json& last = e.at("tensors").back();
    const std::size_t cut = info_at(last).offset + 4;
    CHECK_CONTAINS(open_error(good.substr(0, cut)), fmt::format("truncated: the offset of tensor {} '{}' at byte {} needs 8 bytes, only 4 remain",
                                                                e.at("tensors").size() - 1, last.at("name").get<std::string>(), cut - 4));
    CHECK_CONTAINS(open_error(good.substr(0, data_end - 1)), "runs past the end of the file");
  }

  SUBCASE("counts and lengths larger than the file are refused before anything is allocated") {
    std::string b = good;
    put<std::uint64_t>(b, 16, std::uint64_t{1} << 62);
    CHECK_CONTAINS(open_error(b), "the header claims 4611686018427387904 metadata keys");
    b = good;
    put<std::uint64_t>(b, 8, ~std::uint64_t{0});
    CHECK_CONTAINS(open_error(b), "the header claims 18446744073709551615 tensors");
    b = good;
    put<std::uint64_t>(b, 16, kvs.size() + 1);  // one key more than there is
    CHECK_CONTAINS(open_error(b), "truncated");
    b = good;
    put<std::uint64_t>(b, 24, std::uint64_t{1} << 63);  // the first key's length
    CHECK_CONTAINS(open_error(b), "truncated: metadata key 0 of 9223372036854775808 bytes");
    for (const char* key : {"test.arr_i16", "test.arr_string", "test.nested_i32"}) {
      b = good;
      put<std::uint64_t>(b, value_at(entry(kvs, "key", key)) + 4, std::uint64_t{1} << 61);
      const std::string msg = open_error(b);
      CHECK_CONTAINS(msg, std::string("'") + key + "'");
      CHECK_CONTAINS(msg, "an array of 2305843009213693952");
    }
    b = good;
    put<std::uint64_t>(b, value_at(entry(kvs, "key", "test.string")), std::uint64_t{1} << 40);
    CHECK_CONTAINS(open_error(b), "the value of metadata key 10 'test.string' of 1099511627776 bytes");
  }

  SUBCASE("unknown value types, bad bools, duplicate and empty keys") {
    std::string b = good;
    put<std::uint32_t>(b, value_at(entry(kvs, "key", "test.u8")) - 4, 13);
    CHECK_CONTAINS(open_error(b), "metadata key 'test.u8' at byte");
    CHECK_CONTAINS(open_error(b), "unknown value type 13 (expected 0..12)");
    b = good;
    put<std::uint32_t>(b, value_at(entry(kvs, "key", "test.arr_u8")), 99);
    CHECK_CONTAINS(open_error(b), "unknown array element type 99");
    b = good;
    put<std::uint8_t>(b, value_at(entry(kvs, "key", "test.bool_true")), 2);
    CHECK_CONTAINS(open_error(b), "bool byte is 2, expected 0 or 1");
    b = good;
    put<std::uint8_t>(b, value_at(entry(kvs, "key", "test.arr_bool")) + 12 + 1, 7);
    CHECK_CONTAINS(open_error(b), "bool byte is 7");
    b = good;
    const std::size_t i8 = entry(kvs, "key", "test.i8").at("offset").get<std::size_t>();
    b.replace(i8 + 8, 7, "test.u8");
    CHECK_CONTAINS(open_error(b), "metadata key 'test.u8' appears twice (keys 1 and 2)");
  }

  SUBCASE("built files: no tensors, empty arrays, deep nesting, empty keys") {
    {
      const TempFile t(metadata_file({}));
      const GgufFile f(t.path);
      CHECK(f.metadata().empty());
      CHECK(f.tensors().empty());
    }
    {
      const std::string empty_u32 = u32(static_cast<std::uint32_t>(GgufValueType::uint32)) + u64(0);
      const std::string empty_str = u32(static_cast<std::uint32_t>(GgufValueType::string)) + u64(0);
      const TempFile t(metadata_file({kv("a.ints", GgufValueType::array, empty_u32), kv("a.strs", GgufValueType::array, empty_str)}));
      const GgufFile f(t.path);
      CHECK(f.find("a.ints")->type_name() == "array[uint32; 0]");
      CHECK(f.get_int_array("a.ints")->empty());
      CHECK(f.get_string_array("a.strs")->empty());
      CHECK(f.get_float_array("a.ints")->empty());
      CHECK(f.find("a.ints")->to_string() == "[]");
    }
    const auto nest = [](int depth) {  // depth arrays, each holding the next; the last holds one uint8
      std::string p;
      for (int i = 1; i < depth; ++i) p += u32(static_cast<std::uint32_t>(GgufValueType::array)) + u64(1);
      return kv("a.deep", GgufValueType::array, p + u32(static_cast<std::uint32_t>(GgufValueType::uint8)) + u64(1) + "x");
    };
    {
      const TempFile t(metadata_file({nest(kGgufMaxArrayDepth)}));
      const GgufFile f(t.path);
      CHECK(f.find("a.deep")->items()[0].is_array());
    }
    CHECK_CONTAINS(open_error(metadata_file({nest(kGgufMaxArrayDepth + 1)})), "arrays nested more than 16 deep");
    CHECK_CONTAINS(open_error(metadata_file({nest(100000)})), "arrays nested more than 16 deep");
    CHECK_CONTAINS(open_error(metadata_file({kv("", GgufValueType::uint8, "x")})), "metadata key 0 at byte 24 is 0 bytes long");
  }
}

TEST_CASE("GGUF: bad tensor infos give a clear kvdrive::Error") {
  const json& e = fixtures().at("values");
  const std::string good = read_bytes(fixture_path("values.gguf"));
  const json& a = entry(e.at("tensors"), "name", "tensor.a");   // F32 [3, 2]
  const json& b8 = entry(e.at("tensors"), "name", "tensor.b");  // F16 [4]
  const json& q8 = entry(e.at("tensors"), "name", "q8_0");      // Q8_0 [64, 2]
  const InfoAt ia = info_at(a), ib = info_at(b8), iq = info_at(q8);
  REQUIRE(get<std::uint32_t>(good, ia.n_dims) == 2);
  REQUIRE(get<std::uint64_t>(good, ia.dims) == 3);
  REQUIRE(get<std::uint32_t>(good, ia.type) == 0);
  REQUIRE(get<std::uint64_t>(good, ib.offset) == b8.at("offset").get<std::uint64_t>());
  std::string b;
  const auto edited = [&](auto&& edit) {
    b = good;
    edit();
    return open_error(b);
  };

  CHECK_CONTAINS(edited([&] { put<std::uint32_t>(b, ia.n_dims, 0); }), "tensor 'tensor.a' has 0 dimensions, expected 1..4");
  CHECK_CONTAINS(edited([&] { put<std::uint32_t>(b, ia.n_dims, 5); }), "has 5 dimensions, expected 1..4");
  CHECK_CONTAINS(edited([&] { put<std::uint32_t>(b, ia.n_dims, 0xffffffffu); }), "has 4294967295 dimensions");
  CHECK_CONTAINS(edited([&] { put<std::uint64_t>(b, ia.dims + 8, 0); }), "tensor 'tensor.a' dimension 1 is 0, expected 1..2^63-1");
  CHECK_CONTAINS(edited([&] { put<std::uint64_t>(b, ia.dims, ~std::uint64_t{0}); }), "dimension 0 is 18446744073709551615");
  CHECK_CONTAINS(edited([&] {
                   put<std::uint64_t>(b, ia.dims, std::uint64_t{1} << 32);
                   put<std::uint64_t>(b, ia.dims + 8, std::uint64_t{1} << 32);
                 }),
                 "tensor 'tensor.a': the element count of shape [4294967296, 4294967296] overflows 64 bits");
  CHECK_CONTAINS(edited([&] {
                   put<std::uint64_t>(b, ia.dims, std::uint64_t{1} << 62);
                   put<std::uint64_t>(b, ia.dims + 8, 1);
                 }),
                 "4611686018427387904 F32 elements take more than 2^63 bytes");
  CHECK_CONTAINS(edited([&] { put<std::uint32_t>(b, ia.type, 99); }), "tensor 'tensor.a' has unknown GGML type id 99");
  CHECK_CONTAINS(edited([&] { put<std::uint32_t>(b, ia.type, 4); }), "unknown GGML type id 4");  // Q4_2, long removed
  CHECK_CONTAINS(edited([&] { put<std::uint64_t>(b, iq.dims, 63); }),
                 "tensor 'q8_0' of type Q8_0: its first dimension 63 is not a multiple of the 32-element block");
  CHECK_CONTAINS(edited([&] { put<std::uint64_t>(b, ib.offset, get<std::uint64_t>(good, ib.offset) + 1); }),
                 "tensor 'tensor.b' has offset 33, not a multiple of the alignment 32");
  CHECK_CONTAINS(edited([&] { put<std::uint64_t>(b, ib.offset, 1 << 20); }),
                 "tensor 'tensor.b' (F16 8 bytes at data offset 1048576) runs past the end");
  CHECK_CONTAINS(edited([&] { put<std::uint64_t>(b, ib.offset, std::uint64_t{1} << 63); }), "runs past the end of the file");
  CHECK_CONTAINS(edited([&] { put<std::uint64_t>(b, ib.offset, 0); }), "tensors 'tensor.a' (bytes [0, 24)) and 'tensor.b' (from byte 0) overlap");
  CHECK_CONTAINS(edited([&] { b.replace(ib.n_dims - 8, 8, "tensor.a"); }), "tensor name 'tensor.a' appears twice (tensors 0 and 1)");
  CHECK_CONTAINS(edited([&] { put<std::uint64_t>(b, a.at("info_offset").get<std::size_t>(), std::uint64_t{1} << 60); }),
                 "the name of tensor 0 of 1152921504606846976 bytes");
}

TEST_CASE("GGUF llama: a tied model with rope_freqs, F32 + F16 + Q8_0 + Q4_1 weights, and its tokenizer") {
  const json& e = fixtures().at("llama_tied");
  const json& want = e.at("config");
  const std::string path = fixture_path("llama_tied.gguf");
  const Model m = load_gguf(path);
  const LlamaConfig& c = m.config;
  CHECK(m.source == path);
  CHECK(c.dim == want.at("dim").get<int>());
  CHECK(c.hidden_dim == want.at("hidden_dim").get<int>());
  CHECK(c.layers == want.at("layers").get<int>());
  CHECK(c.heads == want.at("heads").get<int>());
  CHECK(c.kv_heads == want.at("kv_heads").get<int>());
  CHECK(c.vocab == want.at("vocab").get<int>());
  CHECK(c.max_seq == want.at("max_seq").get<int>());
  CHECK(c.rope_theta == want.at("rope_theta").get<double>());
  CHECK(c.rms_eps == want.at("rms_eps").get<float>());
  CHECK(c.tied_embeddings == want.at("tied_embeddings").get<bool>());
  CHECK(c.rope_layout == RopeLayout::interleaved);
  CHECK(c.rope_freq_factors == want.at("rope_freq_factors").get<std::vector<float>>());
  CHECK(c.rope_scaling.factor == 0.0);
  REQUIRE(m.layers.size() == 2);

  // Every tensor: the model points at the file's bytes for it, with its type and shape.
  REQUIRE(m.file != nullptr);
  const std::byte* base = m.file->data();
  const auto at = [&](const std::string& name) { return base + entry(e.at("tensors"), "name", name).at("file_offset").get<std::size_t>(); };
  const auto check_matrix = [&](const Matrix& w, const std::string& name, std::int64_t rows, std::int64_t cols) {
    INFO(name);
    const json& t = entry(e.at("tensors"), "name", name);
    CHECK(w.data == at(name));
    CHECK(ggml_type_name(w.type) == t.at("type").get<std::string>());
    CHECK(w.rows == rows);
    CHECK(w.cols == cols);
    CHECK(w.bytes() == t.at("bytes").get<std::size_t>());
    CHECK(sha256(w.data, w.bytes()) == t.at("sha256").get<std::string>());
  };
  const auto check_norm = [&](const float* p, const std::string& name) {
    INFO(name);
    CHECK(reinterpret_cast<const std::byte*>(p) == at(name));  // F32: used in place
    CHECK(sha256(p, sizeof(float) * static_cast<std::size_t>(c.dim)) == entry(e.at("tensors"), "name", name).at("sha256").get<std::string>());
  };
  check_matrix(m.token_embedding, "token_embd.weight", c.vocab, c.dim);
  CHECK(m.classifier.data == m.token_embedding.data);
  CHECK(m.classifier.type == GgmlType::Q8_0);
  check_norm(m.rms_final, "output_norm.weight");
  for (int l = 0; l < c.layers; ++l) {
    const LayerWeights& w = m.layers[static_cast<std::size_t>(l)];
    const std::string b = "blk." + std::to_string(l) + ".";
    check_norm(w.rms_att, b + "attn_norm.weight");
    check_norm(w.rms_ffn, b + "ffn_norm.weight");
    check_matrix(w.wq, b + "attn_q.weight", c.dim, c.dim);
    check_matrix(w.wk, b + "attn_k.weight", c.kv_dim(), c.dim);
    check_matrix(w.wv, b + "attn_v.weight", c.kv_dim(), c.dim);
    check_matrix(w.wo, b + "attn_output.weight", c.dim, c.dim);
    check_matrix(w.w1, b + "ffn_gate.weight", c.hidden_dim, c.dim);
    check_matrix(w.w2, b + "ffn_down.weight", c.dim, c.hidden_dim);
    check_matrix(w.w3, b + "ffn_up.weight", c.hidden_dim, c.dim);
  }
  CHECK(m.layers[1].wq.type == GgmlType::F32);
  CHECK(m.layers[1].wk.type == GgmlType::F16);
  CHECK(m.layers[0].wq.type == GgmlType::Q4_1);
  std::map<std::string, int> counts;
  for (const json& t : e.at("tensors")) ++counts[t.at("type").get<std::string>()];
  for (const auto& count : counts) CHECK_CONTAINS(m.weight_types, fmt::format("{} ({})", count.first, count.second));
  CHECK(m.owned.empty());  // nothing converted or copied

  // The tokenizer's metadata.
  const GgufFile f(path);
  const GgufVocab v = read_vocab(f);
  const auto value = [&](const char* key) -> const json& { return entry(e.at("kv"), "key", key).at("value"); };
  CHECK(v.model == "gpt2");
  CHECK(v.pre == "smollm");
  REQUIRE(v.tokens.size() == value("tokenizer.ggml.tokens").size());
  for (std::size_t i = 0; i < v.tokens.size(); ++i) CHECK(hex(v.tokens[i]) == value("tokenizer.ggml.tokens")[i].get<std::string>());
  CHECK(v.scores == value("tokenizer.ggml.scores").get<std::vector<float>>());
  CHECK(v.token_types == value("tokenizer.ggml.token_type").get<std::vector<std::int32_t>>());
  REQUIRE(v.merges.size() == value("tokenizer.ggml.merges").size());
  CHECK(hex(v.merges[2]) == value("tokenizer.ggml.merges")[2].get<std::string>());
  CHECK(v.bos == 1);
  CHECK(v.eos == 2);
  CHECK(v.unk == 0);
  CHECK_FALSE(v.eot.has_value());
  CHECK_FALSE(v.pad.has_value());
  CHECK(v.add_bos == true);
  CHECK_FALSE(v.add_eos.has_value());
  CHECK(v.add_space_prefix == false);
  CHECK(hex(v.chat_template) == value("tokenizer.chat_template").get<std::string>());
  CHECK(static_cast<int>(v.tokens.size()) == c.vocab);
}

TEST_CASE("GGUF llama: output.weight, F16 and BF16 norms, linear RoPE scaling, defaults, alignment 2") {
  const json& e = fixtures().at("llama_output");
  const json& want = e.at("config");
  const Model m = load_gguf(fixture_path("llama_output.gguf"));
  const LlamaConfig& c = m.config;
  CHECK(c.dim == want.at("dim").get<int>());
  CHECK(c.hidden_dim == want.at("hidden_dim").get<int>());
  CHECK(c.layers == 1);
  CHECK(c.heads == want.at("heads").get<int>());
  CHECK(c.kv_heads == c.heads);                   // no head_count_kv: as many as the query heads
  CHECK(c.vocab == want.at("vocab").get<int>());  // no vocab_size: the tokens
  CHECK(c.max_seq == want.at("max_seq").get<int>());
  CHECK(c.rope_theta == 10000.0);  // no freq_base
  CHECK(c.rms_eps == 1e-5f);       // no layer_norm_rms_epsilon
  CHECK_FALSE(c.tied_embeddings);
  CHECK(c.rope_freq_factors == want.at("rope_freq_factors").get<std::vector<float>>());  // linear, factor 4

  const auto& tensors = e.at("tensors");
  const auto values = [&](const char* name) { return entry(tensors, "name", name).at("values").get<std::vector<float>>(); };
  CHECK(std::vector<float>(m.layers[0].rms_att, m.layers[0].rms_att + c.dim) == values("blk.0.attn_norm.weight"));  // F16
  CHECK(std::vector<float>(m.layers[0].rms_ffn, m.layers[0].rms_ffn + c.dim) == values("blk.0.ffn_norm.weight"));   // BF16
  CHECK(entry(tensors, "name", "blk.0.attn_norm.weight").at("type") == "F16");
  CHECK(entry(tensors, "name", "blk.0.ffn_norm.weight").at("type") == "BF16");

  // Alignment 2 leaves tensors at addresses that are not 4-byte aligned: those are copied.
  CHECK(e.at("alignment") == 2);
  CHECK_FALSE(e.at("misaligned").empty());
  const auto check = [&](const void* p, std::size_t bytes, const char* name) {
    INFO(name);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 4 == 0);
    CHECK(sha256(p, bytes) == entry(tensors, "name", name).at("sha256").get<std::string>());
  };
  check(m.rms_final, sizeof(float) * static_cast<std::size_t>(c.dim), "output_norm.weight");
  check(m.token_embedding.data, m.token_embedding.bytes(), "token_embd.weight");
  check(m.classifier.data, m.classifier.bytes(), "output.weight");
  check(m.layers[0].wq.data, m.layers[0].wq.bytes(), "blk.0.attn_q.weight");
  check(m.layers[0].w2.data, m.layers[0].w2.bytes(), "blk.0.ffn_down.weight");
  CHECK(m.classifier.type == GgmlType::Q4_0);
  CHECK(m.classifier.rows == c.vocab);
  CHECK(m.classifier.data != m.token_embedding.data);
  CHECK_FALSE(m.owned.empty());

  const GgufVocab v = read_vocab(GgufFile(fixture_path("llama_output.gguf")));
  CHECK(v.scores.empty());
  CHECK(v.tokens.size() == 48);
}

TEST_CASE("GGUF llama: what the loader refuses, with messages naming the problem") {
  const json& e = fixtures().at("llama_tied");
  const std::string good = read_bytes(fixture_path("llama_tied.gguf"));
  const auto load_error = [](const std::string& bytes) {
    const TempFile t(bytes);
    const std::string msg = error_of([&] { load_gguf(t.path); });
    CHECK_MESSAGE(msg.rfind(t.path, 0) == 0, "the message does not start with the path: " << msg);
    return msg;
  };
  const auto tensor = [&](const char* name) -> const json& { return entry(e.at("tensors"), "name", name); };

  SUBCASE("another architecture") {
    std::string b = good;
    const std::size_t at = value_at(entry(e.at("kv"), "key", "general.architecture"));
    REQUIRE(b.substr(at, 13) == std::string("\x05\0\0\0\0\0\0\0llama", 13));
    b.replace(at + 8, 5, "qwen2");
    const std::string msg = load_error(b);
    CHECK_CONTAINS(msg, "general.architecture is 'qwen2'; only llama is supported");
  }
  SUBCASE("a missing tensor, an unexpected one") {
    std::string b = good;
    const std::size_t at = tensor("blk.1.ffn_up.weight").at("info_offset").get<std::size_t>() + 8;
    REQUIRE(b.substr(at, 19) == "blk.1.ffn_up.weight");
    b[at + 18] = 'x';
    CHECK_CONTAINS(load_error(b), "tensor 'blk.1.ffn_up.weight' is missing");
    b = good;
    const std::size_t rf = tensor("rope_freqs.weight").at("info_offset").get<std::size_t>() + 8;
    b.replace(rf, 10, "rope_extra");
    CHECK_CONTAINS(load_error(b), "tensor 'rope_extra.weight' is not part of a 2-layer llama model");
  }
  SUBCASE("a tensor of the wrong shape or type") {
    std::string b = good;
    const InfoAt k = info_at(tensor("blk.1.attn_k.weight"));  // F16 [32, 16] -> [16, 32]: the same bytes
    put<std::uint64_t>(b, k.dims, 16);
    put<std::uint64_t>(b, k.dims + 8, 32);
    const TempFile t(b);
    CHECK_NOTHROW(GgufFile{t.path});  // the file is sound; the model is not
    CHECK_CONTAINS(load_error(b), "tensor 'blk.1.attn_k.weight' has shape [16, 32] (ne0 first), the model's metadata implies [32, 16]");
    b = good;
    put<std::uint32_t>(b, info_at(tensor("output_norm.weight")).type, static_cast<std::uint32_t>(GgmlType::I32));
    CHECK_CONTAINS(load_error(b), "tensor 'output_norm.weight' is I32; norm weights must be F32, F16 or BF16");
    b = good;
    put<std::uint32_t>(b, info_at(tensor("rope_freqs.weight")).type, static_cast<std::uint32_t>(GgmlType::I32));
    CHECK_CONTAINS(load_error(b), "tensor 'rope_freqs.weight' is I32");
  }
  SUBCASE("a block count the tensors cannot back") {
    std::string b = good;
    const std::size_t at = value_at(entry(e.at("kv"), "key", "llama.block_count"));
    REQUIRE(get<std::uint32_t>(b, at) == 2);
    put<std::uint32_t>(b, at, 1u << 30);  // nothing is sized by it before the check
    CHECK_CONTAINS(load_error(b), fmt::format("llama.block_count is 1073741824, but the file has only {} tensors", e.at("tensors").size()));
    put<std::uint32_t>(b, at, 1);
    CHECK_CONTAINS(load_error(b), "tensor 'blk.1.attn_norm.weight' is not part of a 1-layer llama model");
  }
  SUBCASE("a type the decoder cannot compute with") {
    const json& o = fixtures().at("llama_output");
    std::string b = read_bytes(fixture_path("llama_output.gguf"));
    const InfoAt q = info_at(entry(o.at("tensors"), "name", "blk.0.attn_q.weight"));
    REQUIRE(get<std::uint32_t>(b, q.type) == static_cast<std::uint32_t>(GgmlType::Q4_0));
    put<std::uint32_t>(b, q.type, static_cast<std::uint32_t>(GgmlType::IQ4_NL));  // the same block size
    const std::string msg = load_error(b);
    CHECK_CONTAINS(msg, "tensor 'blk.0.attn_q.weight' is IQ4_NL, a type the decoder cannot compute with");
    CHECK_CONTAINS(msg, "Q4_1");
  }
}

TEST_CASE("GGUF llama: hyper-parameters from metadata; unsupported variants are refused") {
  const LlamaConfig c = config_of(llama_keys());
  CHECK(c.dim == 64);
  CHECK(c.hidden_dim == 128);
  CHECK(c.layers == 2);
  CHECK(c.heads == 4);
  CHECK(c.kv_heads == 2);
  CHECK(c.max_seq == 512);
  CHECK(c.vocab == 100);
  CHECK(c.rope_theta == 10000.0);
  CHECK(c.rms_eps == 1e-5f);
  CHECK(c.rope_freq_factors.empty());
  CHECK(c.tied_embeddings);

  CHECK(config_of(with(llama_keys(), kv_f32("llama.rope.freq_base", 1e6f))).rope_theta == 1e6);
  CHECK(config_of(with(llama_keys(), kv_u32("llama.rope.dimension_count", 16))).heads == 4);  // = head_dim
  CHECK(config_of(without(llama_keys(), "llama.attention.head_count_kv")).kv_heads == 4);
  CHECK(config_of(with(without(llama_keys(), "llama.vocab_size"), kv_str_array("tokenizer.ggml.tokens", {"a", "b", "c"}))).vocab == 3);
  CHECK(config_of(with(llama_keys(), kv_f32("llama.rope.scaling.factor", 2))).rope_freq_factors == std::vector<float>(8, 2.0f));
  CHECK(config_of(with(llama_keys(), kv_f32("llama.rope.scale_linear", 3))).rope_freq_factors == std::vector<float>(8, 3.0f));
  CHECK(config_of(with(with(llama_keys(), kv_str("llama.rope.scaling.type", "none")), kv_f32("llama.rope.scaling.factor", 2)))
            .rope_freq_factors.empty());
  CHECK(config_of(with(llama_keys(), kv_f32("llama.rope.scaling.factor", 1))).rope_freq_factors.empty());

  for (const char* arch : {"qwen2", "gemma", "mistral3"}) {
    std::vector<std::string> kvs = llama_keys();
    kvs[0] = kv_str("general.architecture", arch);
    CHECK_CONTAINS(config_error(kvs), fmt::format("general.architecture is '{}'; only llama is supported", arch));
  }
  CHECK_CONTAINS(config_error(without(llama_keys(), "general.architecture")), "no general.architecture");
  CHECK_CONTAINS(config_error(without(llama_keys(), "llama.block_count")), "metadata 'llama.block_count' is missing");
  CHECK_CONTAINS(config_error(without(llama_keys(), "llama.context_length")), "metadata 'llama.context_length' is missing");
  CHECK_CONTAINS(config_error(with(without(llama_keys(), "llama.attention.head_count"), kv_u32("llama.attention.head_count", 0))),
                 "'llama.attention.head_count' is 0, expected 1..2^30");
  CHECK_CONTAINS(config_error(with(without(llama_keys(), "llama.embedding_length"), kv_str("llama.embedding_length", "64"))),
                 "metadata 'llama.embedding_length' is string, expected an integer");
  CHECK_CONTAINS(config_error(with(without(llama_keys(), "llama.attention.head_count"), kv_u32("llama.attention.head_count", 5))),
                 "dim 64 is not a multiple of heads 5");
  CHECK_CONTAINS(config_error(with(llama_keys(), kv_u32("llama.attention.sliding_window", 4096))), "sliding-window attention is not supported");
  CHECK_CONTAINS(config_error(with(llama_keys(), kv_u32("llama.expert_count", 8))), "'llama.expert_count' is 8: mixture-of-experts");
  CHECK_CONTAINS(config_error(with(llama_keys(), kv_u32("llama.rope.dimension_count", 8))),
                 "'llama.rope.dimension_count' is 8 but head_dim (embedding_length / head_count) is 16");
  CHECK_CONTAINS(config_error(with(llama_keys(), kv_str("llama.rope.scaling.type", "yarn"))), "RoPE scaling type 'yarn'");
  CHECK_CONTAINS(config_error(with(llama_keys(), kv_f32("llama.rope.scaling.factor", -2))), "the linear RoPE scaling factor is -2");
  CHECK_CONTAINS(config_error(with(llama_keys(), kv_f32("llama.rope.freq_base", 0))), "'llama.rope.freq_base' is 0, expected a positive number");
  CHECK_CONTAINS(config_error(without(llama_keys(), "llama.vocab_size")), "to give the vocabulary size");
  CHECK_CONTAINS(config_error(with(with(without(without(llama_keys(), "llama.attention.head_count_kv"), "llama.embedding_length"),
                                        kv_u32("llama.embedding_length", 1u << 20)),
                                   kv_u32("llama.attention.head_count_kv", 4))),
                 "head_dim (embedding_length 1048576 / head_count 4) is 262144, expected at most 65536");
  {
    const TempFile t(metadata_file(with(llama_keys(), kv_u32("split.count", 3))));
    CHECK_CONTAINS(error_of([&] { load_gguf(t.path); }), "one of 3 shards of a split GGUF");
  }

  // The vocabulary's own checks.
  const TempFile t(metadata_file(
      {kv_str_array("tokenizer.ggml.tokens", {"a", "b"}), kv("tokenizer.ggml.scores", GgufValueType::array, u32(6) + u64(1) + f32(0.5f))}));
  CHECK_CONTAINS(error_of([&] { read_vocab(GgufFile(t.path)); }), "tokenizer.ggml.scores has 1 entries for 2 tokens");
  const TempFile t2(metadata_file({kv("tokenizer.ggml.bos_token_id", GgufValueType::int32, u32(0xffffffffu))}));
  CHECK_CONTAINS(error_of([&] { read_vocab(GgufFile(t2.path)); }), "tokenizer.ggml.bos_token_id is -1, expected a token id");
}

TEST_CASE("GGUF: SmolLM2-135M-Instruct (Q4_1), as gguf-py's reader sees it") {
  const auto model = kvdrive::test::smollm2_or_skip();
  if (!model) return;
  const json e = json::parse(read_bytes(kvdrive::test::test_data("gguf/smollm2.json")));
  const GgufFile f(model->string());
  CHECK(f.version() == e.at("version").get<std::uint32_t>());
  CHECK(f.file()->size() == e.at("size").get<std::size_t>());
  CHECK(f.tensors().size() == e.at("tensor_count").get<std::size_t>());
  CHECK(f.metadata().size() == e.at("kv_count").get<std::size_t>());
  CHECK(f.data_offset() == e.at("data_offset").get<std::uint64_t>());
  for (const json& want : e.at("tensors")) {
    const std::string name = want.at("name");
    INFO(name);
    const GgufTensor* t = f.find_tensor(name);
    REQUIRE(t != nullptr);
    CHECK(ggml_type_name(t->type) == want.at("type").get<std::string>());
    CHECK(t->dims == want.at("dims").get<std::vector<std::int64_t>>());
    CHECK(t->offset == want.at("offset").get<std::uint64_t>());
    CHECK(t->data == f.file()->data() + want.at("file_offset").get<std::size_t>());
    CHECK(t->bytes == want.at("bytes").get<std::size_t>());
    CHECK(sha256(t->data, t->bytes) == want.at("sha256").get<std::string>());
  }

  const LlamaConfig c = gguf_llama_config(f);
  CHECK(c.layers == 30);
  CHECK(c.dim == 576);
  CHECK(c.heads == 9);
  CHECK(c.kv_heads == 3);
  CHECK(c.hidden_dim == 1536);
  CHECK(c.vocab == 49152);
  CHECK(c.max_seq == 8192);
  CHECK(c.rope_theta == 100000.0);
  CHECK(c.rms_eps == doctest::Approx(1e-5));
  CHECK(c.tied_embeddings);
  CHECK(c.rope_freq_factors.empty());
  CHECK(c.rope_layout == RopeLayout::interleaved);

  const GgufVocab v = read_vocab(f);
  const json& ev = e.at("vocab");
  CHECK(v.tokens.size() == ev.at("tokens").get<std::size_t>());
  CHECK(v.tokens.size() == 49152);
  CHECK(v.merges.size() == 48900);
  CHECK(v.merges.size() == ev.at("merges").get<std::size_t>());
  std::string joined;
  for (std::size_t i = 0; i < v.tokens.size(); ++i) joined += (i ? "\n" : "") + v.tokens[i];
  CHECK(sha256(joined.data(), joined.size()) == ev.at("tokens_sha256").get<std::string>());
  joined.clear();
  for (std::size_t i = 0; i < v.merges.size(); ++i) joined += (i ? "\n" : "") + v.merges[i];
  CHECK(sha256(joined.data(), joined.size()) == ev.at("merges_sha256").get<std::string>());
  CHECK(hex(v.tokens[0]) == ev.at("first_tokens")[0].get<std::string>());
  CHECK(v.model == "gpt2");
  CHECK(v.pre == "smollm");
  CHECK(v.bos == 1);
  CHECK(v.bos == ev.at("bos").get<std::int32_t>());
  CHECK(v.eos == ev.at("eos").get<std::int32_t>());
  CHECK(v.token_types.size() == 49152);
  CHECK(v.add_bos == false);
  CHECK_FALSE(v.chat_template.empty());

  const Model m = load_gguf(model->string());
  CHECK(m.weight_types == "Q4_1 (210), F32 (61), Q8_0 (1)");
  CHECK(m.layers.size() == 30);
  CHECK(m.token_embedding.type == GgmlType::Q8_0);
  CHECK(m.token_embedding.rows == 49152);
  CHECK(m.token_embedding.cols == 576);
  CHECK(m.classifier.data == m.token_embedding.data);
  CHECK(m.layers[0].wk.type == GgmlType::Q4_1);
  CHECK(m.layers[0].wk.rows == 192);
  CHECK(m.layers[29].w2.cols == 1536);
  CHECK(m.owned.empty());
  const auto sha_of = [&](const char* name) { return entry(e.at("tensors"), "name", name).at("sha256").get<std::string>(); };
  CHECK(sha256(m.layers[0].wq.data, m.layers[0].wq.bytes()) == sha_of("blk.0.attn_q.weight"));
  CHECK(sha256(m.layers[29].w2.data, m.layers[29].w2.bytes()) == sha_of("blk.29.ffn_down.weight"));
  CHECK(sha256(m.rms_final, 576 * sizeof(float)) == sha_of("output_norm.weight"));
}
