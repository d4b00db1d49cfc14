// A reader for safetensors files: an 8-byte little-endian header length, a JSON header mapping
// tensor names to {dtype, shape, data_offsets}, then the tensor bytes. The file is mapped; every
// tensor's range is checked against the data region and against the others, so a malformed file
// gives a kvdrive::Error naming the file and the problem instead of a crash.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvdrive/core/error.hpp"
#include "model/mapped_file.hpp"

namespace kvdrive::llama {

struct TensorInfo {
  std::string dtype;  ///< "F32", "F16", "BF16", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  ///< byte range in the data region
  const std::byte* data = nullptr;   ///< start of the tensor's bytes in the mapped file

  /// The element count, or -1 if it overflows.
  std::int64_t elements() const {
    std::int64_t n = 1;
    for (auto d : shape)
      if (__builtin_mul_overflow(n, d, &n)) return -1;
    return n;
  }
};

inline std::size_t safetensors_dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path) : file_(std::make_shared<MappedFile>(path)) {
    const std::string& p = file_->path();
    KVD_EXPECT(file_->size() >= 8, "{}: {} bytes, too short for the 8-byte safetensors header length", p, file_->size());
    std::uint64_t n = 0;
    std::memcpy(&n, file_->data(), 8);
    KVD_EXPECT(n <= file_->size() - 8, "{}: header length {} runs past the end of the file ({} bytes)", p, n, file_->size());
    KVD_EXPECT(n <= (100u << 20), "{}: header length {} is implausibly large", p, n);
    const char* text = reinterpret_cast<const char*>(file_->data() + 8);
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(text, text + n);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: the header is not valid JSON: {}", p, e.what());
    }
    KVD_EXPECT(header.is_object(), "{}: the header is not a JSON object", p);
    const std::byte* data = file_->data() + 8 + n;
    const std::uint64_t data_size = file_->size() - 8 - n;
    std::vector<std::pair<std::uint64_t, std::string>> starts;
    for (auto& [name, t] : header.items()) {
      if (name == "__metadata__") continue;
      try {
        TensorInfo info;
        info.dtype = t.at("dtype").get<std::string>();
        info.shape = t.at("shape").get<std::vector<std::int64_t>>();
        const auto off = t.at("data_offsets").get<std::vector<std::uint64_t>>();
        KVD_EXPECT(off.size() == 2, "{}: tensor '{}': data_offsets needs 2 values, has {}", p, name, off.size());
        info.begin = off[0];
        info.end = off[1];
        const std::size_t es = safetensors_dtype_size(info.dtype);
        KVD_EXPECT(es != 0, "{}: tensor '{}': unknown dtype '{}'", p, name, info.dtype);
        for (auto d : info.shape) KVD_EXPECT(d >= 0 && d < (std::int64_t{1} << 40), "{}: tensor '{}': bad dimension {}", p, name, d);
        KVD_EXPECT(info.begin <= info.end && info.end <= data_size, "{}: tensor '{}': data_offsets [{}, {}) out of range of the {}-byte data region",
                   p, name, info.begin, info.end, data_size);
        KVD_EXPECT(info.elements() >= 0, "{}: tensor '{}': shape has too many elements", p, name);
        // elements x dtype size can wrap to a small number (2^62 F32 elements are "0 bytes"): check the product.
        std::uint64_t bytes = 0;
        KVD_EXPECT(!__builtin_mul_overflow(static_cast<std::uint64_t>(info.elements()), std::uint64_t{es}, &bytes),
                   "{}: tensor '{}': shape of {} {} elements has too many bytes", p, name, info.elements(), info.dtype);
        KVD_EXPECT(info.end - info.begin == bytes, "{}: tensor '{}': {} bytes for shape of {} {} elements", p, name, info.end - info.begin,
                   info.elements(), info.dtype);
        info.data = data + info.begin;
        starts.emplace_back(info.begin, name);
        tensors_.emplace(name, std::move(info));
      } catch (const nlohmann::json::exception& e) {
        fail("{}: tensor '{}': malformed entry: {}", p, name, e.what());
      }
    }
    std::sort(starts.begin(), starts.end());
    for (std::size_t i = 1; i < starts.size(); ++i) {
      const TensorInfo& prev = tensors_.at(starts[i - 1].second);
      KVD_EXPECT(prev.end <= starts[i].first || prev.begin == prev.end, "{}: tensors '{}' and '{}' overlap", p, starts[i - 1].second,
                 starts[i].second);
    }
  }

  const std::string& path() const { return file_->path(); }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  std::shared_ptr<MappedFile> file() const { return file_; }

 private:
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, TensorInfo> tensors_;
};

}  // namespace kvdrive::llama
