// Q/K/V traces: what a decoder computed, per layer and position, for replaying against any
// policy. Format version 1 (little-endian; documented in docs/trace-format.md):
//   header  "KVDTRACE" u32 version u32 dtype(0 f32, 1 f16, 2 bf16) u32 layers u32 q_heads
//           u32 kv_heads u32 head_dim u32 reserved[2]                           (40 bytes)
//   records u64 position u32 layer u32 reserved, then Q [q_heads][head_dim], K and V
//           [kv_heads][head_dim] in the dtype (Q and K after RoPE)
//   footer  "KVDTEND!" u64 records u64 xxh3-64 of every record byte             (24 bytes)
// A file without its footer (a crash while recording) or with a wrong checksum is rejected.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kvdrive/core/config.hpp"
#include "kvdrive/core/dtype.hpp"
#include "kvdrive/core/error.hpp"
#include "kvdrive/core/xxhash.hpp"

namespace kvdrive::eval {

inline constexpr char kTraceMagic[8] = {'K', 'V', 'D', 'T', 'R', 'A', 'C', 'E'};
inline constexpr char kTraceEnd[8] = {'K', 'V', 'D', 'T', 'E', 'N', 'D', '!'};
inline constexpr std::uint32_t kTraceVersion = 1;

struct TraceHeader {
  char magic[8];
  std::uint32_t version, dtype, layers, q_heads, kv_heads, head_dim, reserved[2];
};
static_assert(sizeof(TraceHeader) == 40);

struct TraceFooter {
  char magic[8];
  std::uint64_t records, checksum;
};
static_assert(sizeof(TraceFooter) == 24);

/// Appends records to a trace file; close() (or the destructor) writes the footer.
class TraceWriter {
 public:
  TraceWriter(const std::string& path, const ModelShape& shape, DType dtype) : path_(path), shape_(shape), dtype_(dtype) {
    shape.validate();
    f_ = std::fopen(path.c_str(), "wb");
    KVD_EXPECT(f_ != nullptr, "{}: cannot create the trace file", path);
    TraceHeader h{};
    std::memcpy(h.magic, kTraceMagic, 8);
    h.version = kTraceVersion;
    h.dtype = static_cast<std::uint32_t>(dtype);
    h.layers = static_cast<std::uint32_t>(shape.layers);
    h.q_heads = static_cast<std::uint32_t>(shape.q_heads);
    h.kv_heads = static_cast<std::uint32_t>(shape.kv_heads);
    h.head_dim = static_cast<std::uint32_t>(shape.head_dim);
    put(&h, sizeof h, false);
    XXH3_64bits_reset(&hash_);
  }
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;
  /// Closes the trace, except while an exception unwinds: then the footer is left out, so the
  /// unfinished trace is rejected by readers rather than mistaken for a complete one.
  ~TraceWriter() {
    if (std::uncaught_exceptions() > 0) {
      if (f_) std::fclose(f_);
      return;
    }
    try {
      close();
    } catch (const Error&) {  // a destructor must not throw; close() explicitly to see errors
    }
  }

  /// q: [q_heads][head_dim], k and v: [kv_heads][head_dim], as float.
  void write(int layer, std::int64_t position, const float* q, const float* k, const float* v) {
    KVD_EXPECT(f_ != nullptr, "{}: the trace is closed", path_);
    KVD_EXPECT(layer >= 0 && layer < shape_.layers, "trace: layer {} out of range [0, {})", layer, shape_.layers);
    const std::uint64_t pos = static_cast<std::uint64_t>(position);
    const std::uint32_t meta[2] = {static_cast<std::uint32_t>(layer), 0};
    put(&pos, 8, true);
    put(meta, 8, true);
    row(q, shape_.q_heads);
    row(k, shape_.kv_heads);
    row(v, shape_.kv_heads);
    ++records_;
  }

  void close() {
    if (!f_) return;
    TraceFooter t{};
    std::memcpy(t.magic, kTraceEnd, 8);
    t.records = records_;
    t.checksum = XXH3_64bits_digest(&hash_);
    put(&t, sizeof t, false);
    const bool ok = std::fclose(f_) == 0;
    f_ = nullptr;
    KVD_EXPECT(ok, "{}: error closing the trace file", path_);
  }

  std::uint64_t records() const { return records_; }

 private:
  void row(const float* x, int heads) {
    const std::size_t n = static_cast<std::size_t>(heads) * shape_.head_dim;
    dispatch_dtype(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      buf_.resize(n * sizeof(T));
      T* out = reinterpret_cast<T*>(buf_.data());
      for (std::size_t i = 0; i < n; ++i) out[i] = from_float<T>(x[i]);
    });
    put(buf_.data(), buf_.size(), true);
  }
  void put(const void* p, std::size_t n, bool hashed) {
    KVD_EXPECT(std::fwrite(p, 1, n, f_) == n, "{}: write failed (disk full?)", path_);
    if (hashed) XXH3_64bits_update(&hash_, p, n);
  }

  std::string path_;
  ModelShape shape_;
  DType dtype_;
  std::FILE* f_ = nullptr;
  XXH3_state_t hash_{};
  std::uint64_t records_ = 0;
  std::vector<unsigned char> buf_;
};

/// Reads a whole trace into memory, checking its header, footer and checksum.
class TraceReader {
 public:
  explicit TraceReader(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    KVD_EXPECT(f != nullptr, "{}: cannot open the trace file", path);
    std::vector<unsigned char> bytes;
    unsigned char chunk[1 << 16];
    for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, f)) > 0;) bytes.insert(bytes.end(), chunk, chunk + n);
    std::fclose(f);
    KVD_EXPECT(bytes.size() >= sizeof(TraceHeader) + sizeof(TraceFooter), "{}: {} bytes, too short for a trace", path, bytes.size());
    TraceHeader h;
    std::memcpy(&h, bytes.data(), sizeof h);
    KVD_EXPECT(std::memcmp(h.magic, kTraceMagic, 8) == 0, "{}: not a kvdrive trace (bad magic)", path);
    KVD_EXPECT(h.version == kTraceVersion, "{}: trace format version {}, this reader knows {}", path, h.version, kTraceVersion);
    KVD_EXPECT(h.dtype <= 2, "{}: unknown dtype code {}", path, h.dtype);
    shape_ = {static_cast<int>(h.layers), static_cast<int>(h.q_heads), static_cast<int>(h.kv_heads), static_cast<int>(h.head_dim)};
    try {
      shape_.validate();
    } catch (const Error& e) {
      fail("{}: bad shape in the header: {}", path, e.what());
    }
    dtype_ = static_cast<DType>(h.dtype);
    TraceFooter t;
    std::memcpy(&t, bytes.data() + bytes.size() - sizeof t, sizeof t);
    KVD_EXPECT(std::memcmp(t.magic, kTraceEnd, 8) == 0, "{}: no footer: the trace is truncated or was not closed", path);
    const std::size_t body = bytes.size() - sizeof h - sizeof t;
    record_bytes_ = 16 + (static_cast<std::size_t>(shape_.q_heads) + 2 * static_cast<std::size_t>(shape_.kv_heads)) *
                             static_cast<std::size_t>(shape_.head_dim) * dtype_size(dtype_);  // sizes: the heads may be near 2^31
    KVD_EXPECT(body % record_bytes_ == 0 && body / record_bytes_ == t.records, "{}: {} bytes of records, expected {} records x {} bytes", path, body,
               t.records, record_bytes_);
    KVD_EXPECT(XXH3_64bits(bytes.data() + sizeof h, body) == t.checksum, "{}: checksum mismatch: the trace is corrupt", path);
    body_.assign(bytes.begin() + sizeof h, bytes.end() - sizeof t);
    for (std::uint64_t r = 0; r < t.records; ++r) {
      std::uint64_t pos;
      std::uint32_t layer;
      std::memcpy(&pos, body_.data() + r * record_bytes_, 8);
      std::memcpy(&layer, body_.data() + r * record_bytes_ + 8, 4);
      KVD_EXPECT(layer < h.layers, "{}: record {} has layer {}", path, r, layer);
      index_[{static_cast<int>(layer), static_cast<std::int64_t>(pos)}] = r;
    }
  }

  const ModelShape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  std::size_t records() const { return body_.size() / record_bytes_; }
  bool contains(int layer, std::int64_t position) const { return index_.count({layer, position}) != 0; }
  /// Positions recorded for a layer, ascending.
  std::int64_t positions(int layer) const {
    std::int64_t n = 0;
    for (const auto& [key, r] : index_) n += key.first == layer;
    return n;
  }

  /// Q, K and V of one layer and position, as float: q [q_heads][head_dim], k and v [kv_heads][head_dim].
  void read(int layer, std::int64_t position, std::vector<float>& q, std::vector<float>& k, std::vector<float>& v) const {
    auto it = index_.find({layer, position});
    KVD_EXPECT(it != index_.end(), "trace: no record for layer {} position {}", layer, position);
    const unsigned char* p = body_.data() + it->second * record_bytes_ + 16;
    const auto rows = [&](std::vector<float>& out, int heads) {
      const std::size_t n = static_cast<std::size_t>(heads) * shape_.head_dim;
      out.resize(n);
      dispatch_dtype(dtype_, [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (std::size_t i = 0; i < n; ++i) {
          T x;
          std::memcpy(&x, p + i * sizeof(T), sizeof(T));
          out[i] = to_float(x);
        }
        p += n * sizeof(T);
      });
    };
    rows(q, shape_.q_heads);
    rows(k, shape_.kv_heads);
    rows(v, shape_.kv_heads);
  }

 private:
  ModelShape shape_;
  DType dtype_ = DType::f32;
  std::size_t record_bytes_ = 0;
  std::vector<unsigned char> body_;
  std::map<std::pair<int, std::int64_t>, std::uint64_t> index_;
};

}  // namespace kvdrive::eval
