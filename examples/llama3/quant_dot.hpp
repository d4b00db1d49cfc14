// The decoder's projections computed straight from GGUF blocks (quant.hpp defines the formats).
//
// Activations are quantized per block, the way the weights' integer parts can meet them:
//   Q8x32   for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: blocks of 32 int8 with a float scale
//           d = max|x| / 127 (q = x / d rounded to nearest even), and d * (the sum of the block's
//           q), which the formats with a minimum meet;
//   Q8x256  for Q4_K, Q5_K, Q6_K: blocks of 256 int8 with one float scale and the sums of q over
//           each 16 values (the K-quants' minimums and Q6_K's -32 offset become one integer dot
//           of the sub-block scales with these sums, so a 256-value block costs two fmas);
//   F32, F16 and BF16 weights take the float activations.
// Measured against float activations meeting weights dequantized on the fly (decode, one thread,
// quantizing the activations included): Q4_1 18 against 10 GB/s, Q8_0 30 against 16-18 GB/s.
// Per-32 scales for the K-quants' activations would cost 8 fmas a 256-value block instead of 2.
//
// A weight block's integer dot with an activation block is exact (maddubs + madd on AVX2, int
// loops in the portable code). Each (row, input) keeps 8 float lanes: lane l gathers the values
// 4l .. 4l+3 of every 32-value unit. Per block (tile_q32, tile_qk45, tile_q6k say exactly):
//   Q4_0, Q5_0, Q8_0  lane = fma(dw * dx, I_l, lane)            } blocks of even and odd index
//   Q4_1, Q5_1        lane += fma(dw * dx, I_l, l ? 0 : m * s)   } in two sets of lanes
//                     (s = dx * the sum of the block's q)
//   Q4_K, Q5_K        lane = fma(d * dx, I_l, lane); lane = fma(-(dmin * dx), m_l * S_l, lane)
//                     (S_l = the sum of sub-block l's q)
//   Q6_K              lane = fma(d * dx, I_l - 32 * (scales . sums of 16)_l, lane)
// and at the end the lanes are added in one fixed order (sum_lanes). The portable code computes
// the same integers and the same fmas in the same order (std::fma; no product of this code meets
// an add the compiler could contract it with), so both paths give the same floats bit for bit.
// Every (row, input) is computed on its own, whatever the tile or the thread: results do not
// depend on the thread count, and matmul's result for an input equals matvec's.
//
// Tiles (rows x inputs, chosen by measurement, see Tiles): decode one row at a time, prefill one
// row x 4 inputs, each weight block decoded once for the 4.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>  // std::exchange, for thread_pool.hpp
#include <vector>

#include "kvdrive/attention/cpu_kernels.hpp"
#include "kvdrive/core/thread_pool.hpp"
#include "quant.hpp"

#if KVD_CPU_AVX2 && defined(__F16C__)
#define KVD_QUANT_F16C 1
#else
#define KVD_QUANT_F16C 0
#endif

#if defined(__clang__)
#define KVD_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define KVD_UNROLL _Pragma("GCC unroll 16")
#else
#define KVD_UNROLL
#endif

namespace kvdrive::llama::quant {

// ---- activations ------------------------------------------------------------------------------

enum class ActFormat : int { Float, Q8x32, Q8x256 };

/// The activation format a weight type computes with.
constexpr ActFormat act_format(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
      return ActFormat::Q8x32;
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: return ActFormat::Q8x256;
    default: return ActFormat::Float;
  }
}

constexpr int act_block(ActFormat f) { return f == ActFormat::Q8x256 ? kQKK : kQK; }

/// One quantized activation row, as the kernels read it.
struct ActRow {
  const std::int8_t* q = nullptr;  ///< the row's values
  /// Q8x32: 2 per block, the scale d and d * (the sum of the block's q), side by side for one load;
  /// Q8x256: the scale of each block.
  const float* d = nullptr;
  const std::int16_t* sums16 = nullptr;  ///< Q8x256: 16 per block, the sums of q[16g .. 16g+16)
  int d_stride = 1;                      ///< 2 (Q8x32) or 1 (Q8x256)

  float scale(std::int64_t b) const { return d[b * d_stride]; }
};

/// q = x * inv_d rounded to nearest even, as an int8: the conversion AVX2's cvtps_epi32 + the
/// saturating packs perform (NaN and values beyond int32 become -128).
inline std::int8_t round_to_i8(float v) {
  const float r = std::nearbyint(v);
  if (!(r >= -2147483648.0f && r < 2147483648.0f)) return -128;
  return static_cast<std::int8_t>(std::clamp(r, -128.0f, 127.0f));
}

/// Quantizes `len` values (a multiple of 32) with one scale; returns it.
inline float quantize_block_q8(const float* x, int len, std::int8_t* q) {
#if KVD_CPU_AVX2
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  for (int j = 0; j < len; j += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float amax = _mm_cvtss_f32(m4);
#else
  float amax = 0.0f;
  for (int j = 0; j < len; ++j) amax = std::max(amax, std::fabs(x[j]));
#endif
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
#if KVD_CPU_AVX2
  const __m256 vid = _mm256_set1_ps(id);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int j = 0; j < len; j += 32) {
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j), vid));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8), vid));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 16), vid));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 24), vid));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j), _mm256_permutevar8x32_epi32(p, order));
  }
#else
  for (int j = 0; j < len; ++j) q[j] = round_to_i8(x[j] * id);
#endif
  return d;
}

/// n activation rows of `cols` values quantized in `format`'s blocks. Reused across calls: its
/// buffers only grow.
class QuantizedActs {
 public:
  /// Quantizes x[n][cols]; rows are shared out on `pool` when given (each row's result is the same).
  void quantize(ActFormat format, const float* x, std::size_t n, std::int64_t cols, ThreadPool* pool = nullptr) {
    KVD_EXPECT(format != ActFormat::Float, "QuantizedActs: Float is not a quantized activation format");
    const int blk = act_block(format);
    KVD_EXPECT(cols > 0 && cols % blk == 0, "activation rows of {} values are not a whole number of {}-value blocks", cols, blk);
    format_ = format;
    n_ = n;
    cols_ = cols;
    nb_ = cols / blk;
    const std::size_t blocks = n * static_cast<std::size_t>(nb_);
    grow(q_, n * static_cast<std::size_t>(cols));
    grow(d_, blocks);
    if (format == ActFormat::Q8x32)
      grow(d_, 2 * blocks);
    else
      grow(sums16_, blocks * 16);
    auto one = [&](std::size_t i) { quantize_row(x + i * static_cast<std::size_t>(cols), i); };
    if (pool != nullptr && n >= 4) {
      pool->parallel_for(n, one);
    } else {
      for (std::size_t i = 0; i < n; ++i) one(i);
    }
  }

  ActFormat format() const { return format_; }
  std::size_t rows() const { return n_; }
  std::int64_t cols() const { return cols_; }
  std::int64_t blocks_per_row() const { return nb_; }

  ActRow row(std::size_t i) const {
    ActRow r;
    r.q = q_.data() + i * static_cast<std::size_t>(cols_);
    r.d_stride = format_ == ActFormat::Q8x32 ? 2 : 1;
    r.d = d_.data() + i * static_cast<std::size_t>(nb_) * static_cast<std::size_t>(r.d_stride);
    if (format_ == ActFormat::Q8x256) r.sums16 = sums16_.data() + i * static_cast<std::size_t>(nb_) * 16;
    return r;
  }

  /// out[cols] = row i as the kernels see it: d * q per block.
  void dequantize(std::size_t i, float* out) const {
    const ActRow r = row(i);
    const int blk = act_block(format_);
    for (std::int64_t j = 0; j < cols_; ++j) out[j] = r.scale(j / blk) * static_cast<float>(r.q[j]);
  }

 private:
  template <class T>
  static void grow(std::vector<T>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
  }

  void quantize_row(const float* x, std::size_t i) {
    const int blk = act_block(format_);
    const std::size_t stride = format_ == ActFormat::Q8x32 ? 2 : 1;
    std::int8_t* q = q_.data() + i * static_cast<std::size_t>(cols_);
    float* d = d_.data() + i * static_cast<std::size_t>(nb_) * stride;
    for (std::int64_t b = 0; b < nb_; ++b) {
      std::int8_t* qb = q + b * blk;
      const float scale = quantize_block_q8(x + b * blk, blk, qb);
      d[static_cast<std::size_t>(b) * stride] = scale;
      if (format_ == ActFormat::Q8x32) {
        int sum = 0;
        for (int k = 0; k < blk; ++k) sum += qb[k];
        d[2 * b + 1] = scale * static_cast<float>(sum);
      } else {
        std::int16_t* s16 = sums16_.data() + (i * static_cast<std::size_t>(nb_) + static_cast<std::size_t>(b)) * 16;
        for (int g = 0; g < 16; ++g) {
          int sum = 0;
          for (int k = 0; k < 16; ++k) sum += qb[16 * g + k];
          s16[g] = static_cast<std::int16_t>(sum);
        }
      }
    }
  }

  ActFormat format_ = ActFormat::Q8x32;
  std::size_t n_ = 0;
  std::int64_t cols_ = 0, nb_ = 0;
  std::vector<std::int8_t> q_;
  std::vector<float> d_;
  std::vector<std::int16_t> sums16_;
};

// ---- shared pieces ----------------------------------------------------------------------------

/// A block's fp16 scale as float (F16C where available; the same exact value either way).
inline float scale_f16(const std::byte* p) {
#if KVD_QUANT_F16C
  return _cvtsh_ss(load_u16(p));
#else
  return load_f16(p);
#endif
}

/// The fixed order in which a (row, input)'s 8 lanes are added: ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)).
inline float sum_lanes(const float l[8]) {
  const float s0 = l[0] + l[4], s1 = l[1] + l[5], s2 = l[2] + l[6], s3 = l[3] + l[7];
  return (s0 + s2) + (s1 + s3);
}

#if KVD_CPU_AVX2
inline float sum_lanes(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // s0..s3
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                  // s0+s2, s1+s3
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

/// 8 int32 lanes: lane l = sum over k < 4 of w[4l+k] * x[4l+k], w unsigned (< 128), x signed.
inline __m256i dot_u8s8(__m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}
/// The same with signed w (aw = |w|): |w| * (x * sign w) keeps maddubs' operands in range.
inline __m256i dot_s8s8(__m256i aw, __m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}
/// The 32 4-bit values of 16 packed bytes: the low nibbles (values 0..15), then the high ones
/// (values 16..31): the bytes in both halves, the upper half shifted right by 4, masked.
inline __m256i nibbles32(const std::byte* p) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}
/// 0xFF in byte j where bit j of the 32-bit qh is set, 0 elsewhere.
inline __m256i bit_mask32(std::uint32_t qh) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(qh)),
      _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
  const __m256i bit = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL);  // all bits but bit j % 8
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, bit), _mm256_set1_epi64x(-1));
}
#endif

// ---- the 32-value formats ---------------------------------------------------------------------
// Each describes its block: bytes, whether values are signed (Q4_0, Q5_0, Q8_0: q - offset) or
// unsigned with a minimum (Q4_1, Q5_1), and decodes the 32 integer values (portable: ints; AVX2:
// one vector of int8).

struct Q4_0Block {
  static constexpr int kBytes = 18;
  static constexpr bool kMin = false;
  static void values(const std::byte* b, int v[32]) {
    const std::uint8_t* qs = bytes(b + 2);
    for (int j = 0; j < 16; ++j) v[j] = (qs[j] & 0x0F) - 8, v[j + 16] = (qs[j] >> 4) - 8;
  }
#if KVD_CPU_AVX2
  static __m256i values(const std::byte* b) { return _mm256_sub_epi8(nibbles32(b + 2), _mm256_set1_epi8(8)); }
#endif
};

struct Q4_1Block {
  static constexpr int kBytes = 20;
  static constexpr bool kMin = true;
  static void values(const std::byte* b, int v[32]) {
    const std::uint8_t* qs = bytes(b + 4);
    for (int j = 0; j < 16; ++j) v[j] = qs[j] & 0x0F, v[j + 16] = qs[j] >> 4;
  }
#if KVD_CPU_AVX2
  static __m256i values(const std::byte* b) { return nibbles32(b + 4); }
#endif
};

struct Q5_0Block {
  static constexpr int kBytes = 22;
  static constexpr bool kMin = false;
  static void values(const std::byte* b, int v[32]) {
    const std::uint32_t qh = load_u32(b + 2);
    const std::uint8_t* qs = bytes(b + 6);
    for (int j = 0; j < 16; ++j) {
      v[j] = ((qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4)) - 16;
      v[j + 16] = ((qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4)) - 16;
    }
  }
#if KVD_CPU_AVX2
  // q - 16 = the nibble where the fifth bit is set, nibble - 16 (= nibble | 0xF0) where it is not.
  static __m256i values(const std::byte* b) {
    const __m256i hi = _mm256_andnot_si256(bit_mask32(load_u32(b + 2)), _mm256_set1_epi8(static_cast<char>(0xF0)));
    return _mm256_or_si256(nibbles32(b + 6), hi);
  }
#endif
};

struct Q5_1Block {
  static constexpr int kBytes = 24;
  static constexpr bool kMin = true;
  static void values(const std::byte* b, int v[32]) {
    const std::uint32_t qh = load_u32(b + 4);
    const std::uint8_t* qs = bytes(b + 8);
    for (int j = 0; j < 16; ++j) {
      v[j] = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      v[j + 16] = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    }
  }
#if KVD_CPU_AVX2
  static __m256i values(const std::byte* b) {
    const __m256i hi = _mm256_and_si256(bit_mask32(load_u32(b + 4)), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nibbles32(b + 8), hi);
  }
#endif
};

struct Q8_0Block {
  static constexpr int kBytes = 34;
  static constexpr bool kMin = false;
  static void values(const std::byte* b, int v[32]) {
    const auto* qs = reinterpret_cast<const std::int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) v[j] = qs[j];
  }
#if KVD_CPU_AVX2
  static __m256i values(const std::byte* b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)); }
#endif
};

/// out[r * C + c] = row r . input c, for R weight rows and C activation rows of nb 32-value blocks.
/// Per (row, input), with I the 8 integer lanes of a block, dd = dw * dx and ms = m * (dx * the
/// sum of the block's q):
///   signed formats:  acc[b % 2] = fma(dd, I, acc[b % 2])
///   with a minimum:  acc[b % 2] += fma(dd, I, (ms, 0, .., 0))   (the minimum's term in lane 0)
/// and result = sum_lanes(acc[0] + acc[1]). Two chains (blocks of even and odd index) hide the
/// latency of the accumulation: +25 % for Q4_1 decode against one. No product here can be
/// contracted into an add (the only adds take fma results), so the order is the one written, in
/// both paths.
template <class F, int R, int C>
void tile_q32(const std::byte* const* rows, const ActRow* a, std::int64_t nb, float* out) {
#if KVD_CPU_AVX2
  __m256 acc[R][C][2];
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c)
    acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();
  // One block into the accumulators `par` (a constant: the array stays in registers).
  auto step = [&](std::int64_t b, auto par) {
    __m256i w[R], aw[R];
    __m128 dm[R];  // (d, m, 0, 0) of blocks with a minimum
    __m256 dw[R];  // d, broadcast, of signed blocks
    KVD_UNROLL for (int r = 0; r < R; ++r) {
      const std::byte* blk = rows[r] + b * F::kBytes;
      w[r] = F::values(blk);
      if constexpr (F::kMin) {  // d and m side by side: one conversion
#if KVD_QUANT_F16C
        dm[r] = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(blk))));
#else
        dm[r] = _mm_setr_ps(load_f16(blk), load_f16(blk + 2), 0.0f, 0.0f);
#endif
      } else {
        dw[r] = _mm256_set1_ps(scale_f16(blk));
        aw[r] = _mm256_abs_epi8(w[r]);
      }
    }
    KVD_UNROLL for (int c = 0; c < C; ++c) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[c].q + b * kQK));
      if constexpr (F::kMin) {
        // (dx, dx * sum q, 0, 0): one load
        const __m128 xs = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(a[c].d + 2 * b)));
        KVD_UNROLL for (int r = 0; r < R; ++r) {
          const __m128 p = _mm_mul_ps(dm[r], xs);  // (dd, ms, 0, 0)
          const __m256 dd = _mm256_broadcastss_ps(p);
          const __m256 ms = _mm256_zextps128_ps256(_mm_castsi128_ps(_mm_srli_si128(_mm_castps_si128(p), 4)));
          const __m256 t = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(dot_u8s8(w[r], x)), ms);
          acc[r][c][decltype(par)::value] = _mm256_add_ps(acc[r][c][decltype(par)::value], t);
        }
      } else {
        const __m256 dx = _mm256_broadcast_ss(a[c].d + 2 * b);
        KVD_UNROLL for (int r = 0; r < R; ++r) {
          const __m256 i = _mm256_cvtepi32_ps(dot_s8s8(aw[r], w[r], x));
          acc[r][c][decltype(par)::value] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dx), i, acc[r][c][decltype(par)::value]);
        }
      }
    }
  };
  std::int64_t b = 0;
  for (; b + 1 < nb; b += 2) step(b, std::integral_constant<int, 0>{}), step(b + 1, std::integral_constant<int, 1>{});
  if (b < nb) step(b, std::integral_constant<int, 0>{});
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c)
    out[r * C + c] = sum_lanes(_mm256_add_ps(acc[r][c][0], acc[r][c][1]));
#else
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float acc[2][8] = {};
      for (std::int64_t b = 0; b < nb; ++b) {
        const std::byte* blk = rows[r] + b * F::kBytes;
        int v[32];
        F::values(blk, v);
        const std::int8_t* x = a[c].q + b * kQK;
        const float dd = load_f16(blk) * a[c].d[2 * b];
        for (int l = 0; l < 8; ++l) {
          int s = 0;
          for (int k = 0; k < 4; ++k) s += v[4 * l + k] * x[4 * l + k];
          if constexpr (F::kMin) {
            const float ms = l == 0 ? load_f16(blk + 2) * a[c].d[2 * b + 1] : 0.0f;
            acc[b & 1][l] = acc[b & 1][l] + std::fma(dd, static_cast<float>(s), ms);
          } else {
            float& lane = acc[b & 1][l];
            lane = std::fma(dd, static_cast<float>(s), lane);
          }
        }
      }
      float lanes[8];
      for (int l = 0; l < 8; ++l) lanes[l] = acc[0][l] + acc[1][l];
      out[r * C + c] = sum_lanes(lanes);
    }
#endif
}

// ---- the K-quants -----------------------------------------------------------------------------

/// scale_min_k4 on 32-bit words: the 8 scales and the 8 mins as the bytes of two 64-bit words.
inline void scale_min_k4_words(const std::byte* p, std::uint64_t& sc, std::uint64_t& m) {
  const std::uint32_t s0 = load_u32(p), s1 = load_u32(p + 4), s2 = load_u32(p + 8);
  const std::uint32_t sc_lo = s0 & 0x3f3f3f3fu, sc_hi = (s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u);
  const std::uint32_t m_lo = s1 & 0x3f3f3f3fu, m_hi = ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u);
  sc = sc_lo | (static_cast<std::uint64_t>(sc_hi) << 32);
  m = m_lo | (static_cast<std::uint64_t>(m_hi) << 32);
}

/// Q4_K and Q5_K (kHigh: the fifth bits in qh[32]).
template <bool kHigh>
struct QK45Block {
  static constexpr int kBytes = kHigh ? 176 : 144;
  static constexpr int kQs = kHigh ? 48 : 16;
  /// The 256 values 0..31 in order.
  static void values(const std::byte* b, int v[256]) {
    const std::uint8_t* qs = bytes(b + kQs);
    const std::uint8_t* qh = bytes(b + 16);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        v[64 * c + l] = qs[32 * c + l] & 0x0F;
        v[64 * c + 32 + l] = qs[32 * c + l] >> 4;
        if (kHigh) {
          v[64 * c + l] |= ((qh[l] >> (2 * c)) & 1) << 4;
          v[64 * c + 32 + l] |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
        }
      }
  }
};

template <bool kHigh, int R, int C>
void tile_qk45(const std::byte* const* rows, const ActRow* a, std::int64_t nb, float* out) {
  using F = QK45Block<kHigh>;
#if KVD_CPU_AVX2
  __m256 acc[R][C];
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  for (std::int64_t b = 0; b < nb; ++b) {
    __m256i scales[R], mins[R], qh[R];
    float d[R], dmin[R];
    const std::byte* blk[R];
    KVD_UNROLL for (int r = 0; r < R; ++r) {
      blk[r] = rows[r] + b * F::kBytes;
      d[r] = scale_f16(blk[r]);
      dmin[r] = scale_f16(blk[r] + 2);
      std::uint64_t sc8, m8;
      scale_min_k4_words(blk[r] + 4, sc8, m8);
      // scales: the 8 int16 scales in both halves (a sub-block's is broadcast by a shuffle);
      // mins: m0 m0 m1 m1 .. m7 m7 as int16, to meet the 16 sums of 16 in one madd.
      scales[r] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc8))));
      const __m128i m64 = _mm_cvtsi64_si128(static_cast<long long>(m8));
      mins[r] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m64, m64));
      if constexpr (kHigh) qh[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r] + 16));
    }
    __m256i isum[R][C];
    KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) isum[r][c] = _mm256_setzero_si256();
    KVD_UNROLL for (int k = 0; k < 4; ++k) {  // 64 values: sub-blocks 2k (low nibbles), 2k+1 (high)
      const __m256i pick_lo = _mm256_set1_epi16(static_cast<short>(((4 * k + 1) << 8) | (4 * k)));
      const __m256i pick_hi = _mm256_set1_epi16(static_cast<short>(((4 * k + 3) << 8) | (4 * k + 2)));
      KVD_UNROLL for (int r = 0; r < R; ++r) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r] + F::kQs + 32 * k));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if constexpr (kHigh) {  // bit 2k of qh -> value bit 4 (low), bit 2k+1 -> bit 4 (high)
          lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(qh[r], 4), bit4));
          hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(qh[r], 3), bit4));
          qh[r] = _mm256_srli_epi16(qh[r], 2);
        }
        const __m256i sc_lo = _mm256_shuffle_epi8(scales[r], pick_lo), sc_hi = _mm256_shuffle_epi8(scales[r], pick_hi);
        KVD_UNROLL for (int c = 0; c < C; ++c) {
          const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[c].q + b * kQKK + 64 * k));
          const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[c].q + b * kQKK + 64 * k + 32));
          const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), sc_lo);
          const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), sc_hi);
          isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_add_epi32(pl, ph));
        }
      }
    }
    KVD_UNROLL for (int c = 0; c < C; ++c) {
      const float dx = a[c].d[b];
      const __m256i s16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[c].sums16 + b * 16));
      KVD_UNROLL for (int r = 0; r < R; ++r) {
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(d[r] * dx), _mm256_cvtepi32_ps(isum[r][c]), acc[r][c]);
        const __m256i msum = _mm256_madd_epi16(mins[r], s16);  // lane s: m_s * (sum of sub-block s)
        acc[r][c] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin[r] * dx), _mm256_cvtepi32_ps(msum), acc[r][c]);
      }
    }
  }
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) out[r * C + c] = sum_lanes(acc[r][c]);
#else
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (std::int64_t b = 0; b < nb; ++b) {
        const std::byte* blk = rows[r] + b * F::kBytes;
        int v[256];
        F::values(blk, v);
        std::uint8_t sc[8], m[8];
        scale_min_k4(bytes(blk + 4), sc, m);
        const std::int8_t* x = a[c].q + b * kQKK;
        const std::int16_t* s16 = a[c].sums16 + b * 16;
        int lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int s = 0; s < 8; ++s)
          for (int l = 0; l < 8; ++l) {
            int t = 0;
            for (int k = 0; k < 4; ++k) t += v[32 * s + 4 * l + k] * x[32 * s + 4 * l + k];
            lane[l] += sc[s] * t;
          }
        const float dd = load_f16(blk) * a[c].d[b], dmd = load_f16(blk + 2) * a[c].d[b];
        for (int l = 0; l < 8; ++l) acc[l] = std::fma(dd, static_cast<float>(lane[l]), acc[l]);
        for (int l = 0; l < 8; ++l) acc[l] = std::fma(-dmd, static_cast<float>(m[l] * (s16[2 * l] + s16[2 * l + 1])), acc[l]);
      }
      out[r * C + c] = sum_lanes(acc);
    }
#endif
}

/// Q6_K: ql[128], qh[64], int8 scales[16], fp16 d. The kernels meet the unsigned 6-bit values
/// and take the -32 offset off as 32 * (scales . sums of 16).
template <int R, int C>
void tile_q6k(const std::byte* const* rows, const ActRow* a, std::int64_t nb, float* out) {
  constexpr int kBytes = 210;
#if KVD_CPU_AVX2
  __m256 acc[R][C];
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  for (std::int64_t b = 0; b < nb; ++b) {
    __m256i sc8[R], sc16[R];
    float d[R];
    const std::byte* blk[R];
    KVD_UNROLL for (int r = 0; r < R; ++r) {
      blk[r] = rows[r] + b * kBytes;
      d[r] = scale_f16(blk[r] + 208);
      const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[r] + 192));
      sc8[r] = _mm256_broadcastsi128_si256(s);  // the 16 int8 scales in both halves
      sc16[r] = _mm256_cvtepi8_epi16(s);        // as int16
    }
    __m256i isum[R][C];
    KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) isum[r][c] = _mm256_setzero_si256();
    // Scale of 32-value unit u: int16 lanes 0..7 take scales[2u], lanes 8..15 scales[2u+1]: the
    // shuffle puts the scale byte in each int16's high byte (0x80: zero), srai sign-extends it.
    __m256i pick = _mm256_setr_epi8(-128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0,
                                    -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1);
    KVD_UNROLL for (int h = 0; h < 2; ++h) {
      KVD_UNROLL for (int r = 0; r < R; ++r) {
        const std::byte* ql = blk[r] + 64 * h;
        const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
        const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
        const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r] + 128 + 32 * h));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
        KVD_UNROLL for (int k = 0; k < 4; ++k) {
          const __m256i pk = _mm256_add_epi8(pick, _mm256_set1_epi16(static_cast<short>((8 * h + 2 * k) << 8)));
          const __m256i scale = _mm256_srai_epi16(_mm256_shuffle_epi8(sc8[r], pk), 8);
          KVD_UNROLL for (int c = 0; c < C; ++c) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[c].q + b * kQKK + 128 * h + 32 * k));
            isum[r][c] = _mm256_add_epi32(isum[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], x), scale));
          }
        }
      }
    }
    KVD_UNROLL for (int c = 0; c < C; ++c) {
      const float dx = a[c].d[b];
      const __m256i s16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[c].sums16 + b * 16));
      KVD_UNROLL for (int r = 0; r < R; ++r) {
        const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16[r], s16), 5);
        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(d[r] * dx), _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[r][c], off)), acc[r][c]);
      }
    }
  }
  KVD_UNROLL for (int r = 0; r < R; ++r) KVD_UNROLL for (int c = 0; c < C; ++c) out[r * C + c] = sum_lanes(acc[r][c]);
#else
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (std::int64_t b = 0; b < nb; ++b) {
        const std::byte* blk = rows[r] + b * kBytes;
        const std::uint8_t* ql = bytes(blk);
        const std::uint8_t* qh = bytes(blk + 128);
        const auto* sc = reinterpret_cast<const std::int8_t*>(blk + 192);
        const std::int8_t* x = a[c].q + b * kQKK;
        const std::int16_t* s16 = a[c].sums16 + b * 16;
        int lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int u = 0; u < 8; ++u)  // unit u = half u / 4, k = u % 4
          for (int l = 0; l < 8; ++l) {
            int t = 0;
            for (int k = 0; k < 4; ++k) t += q6_k_value(ql, qh, u / 4, u % 4, 4 * l + k) * x[32 * u + 4 * l + k];
            lane[l] += sc[2 * u + (l >= 4 ? 1 : 0)] * t;
          }
        for (int l = 0; l < 8; ++l) lane[l] -= 32 * (sc[2 * l] * s16[2 * l] + sc[2 * l + 1] * s16[2 * l + 1]);
        const float dd = load_f16(blk + 208) * a[c].d[b];
        for (int l = 0; l < 8; ++l) acc[l] = std::fma(dd, static_cast<float>(lane[l]), acc[l]);
      }
      out[r * C + c] = sum_lanes(acc);
    }
#endif
}

// ---- float weights ----------------------------------------------------------------------------

inline float weight_value(float w) { return w; }
inline float weight_value(half w) { return half_bits_to_float(w.bits); }
inline float weight_value(bfloat16 w) { return bf16_bits_to_float(w.bits); }

/// y[r] = W[r] . x for `rows` (<= 4) consecutive rows of `in` values of type T (float, half,
/// bfloat16). AVX2: 4 rows x 2 vectors of 8 lanes (lane k of vector v gathers the values
/// j = 16i + 8v + k), the two vectors added lane-wise, then the lanes in sum8's order; the
/// portable loop makes the same fmas in the same order.
template <class T>
inline void dot_rows_float(const T* w, const float* x, float* y, std::size_t rows, std::size_t in) {
#if KVD_CPU_AVX2
  if (rows == 4 && in % 16 == 0) {
    using attention::detail::load8;
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    const T* w0 = w;
    const T* w1 = w + in;
    const T* w2 = w + 2 * in;
    const T* w3 = w + 3 * in;
    for (std::size_t j = 0; j < in; j += 16) {
      const __m256 xa = _mm256_loadu_ps(x + j), xb = _mm256_loadu_ps(x + j + 8);
      acc[0] = _mm256_fmadd_ps(load8(w0 + j), xa, acc[0]);
      acc[1] = _mm256_fmadd_ps(load8(w0 + j + 8), xb, acc[1]);
      acc[2] = _mm256_fmadd_ps(load8(w1 + j), xa, acc[2]);
      acc[3] = _mm256_fmadd_ps(load8(w1 + j + 8), xb, acc[3]);
      acc[4] = _mm256_fmadd_ps(load8(w2 + j), xa, acc[4]);
      acc[5] = _mm256_fmadd_ps(load8(w2 + j + 8), xb, acc[5]);
      acc[6] = _mm256_fmadd_ps(load8(w3 + j), xa, acc[6]);
      acc[7] = _mm256_fmadd_ps(load8(w3 + j + 8), xb, acc[7]);
    }
    __m256 pair[8] = {_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]),
                      _mm256_add_ps(acc[4], acc[5]), _mm256_add_ps(acc[6], acc[7]),
                      _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    alignas(32) float s[8];
    _mm256_store_ps(s, attention::detail::sum8(pair));
    for (int r = 0; r < 4; ++r) y[r] = s[r];
    return;
  }
#endif
  for (std::size_t r = 0; r < rows; ++r) {
    const T* wr = w + r * in;
    if (in % 16 == 0) {  // the AVX2 order: 16 lanes, paired, then sum8's tree
      float part[16] = {};
      for (std::size_t j = 0; j < in; ++j) part[j & 15] = std::fma(weight_value(wr[j]), x[j], part[j & 15]);
      float v[8];
      for (int k = 0; k < 8; ++k) v[k] = part[k] + part[k + 8];
      y[r] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    } else {
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (std::size_t j = 0; j < in; ++j) part[j & 7] = std::fma(weight_value(wr[j]), x[j], part[j & 7]);
      y[r] = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
    }
  }
}

/// W[r] . x for one row of `in` values of type T (half, bfloat16): 32 partial sums, value j into
/// partial j % 32 (AVX2: 4 accumulators of 8 lanes), combined as ((p[l] + p[l+8]) + (p[l+16] +
/// p[l+24])) per lane l, then sum_lanes. One row at a time keeps decode a single sequential
/// stream (measured: 26 GB/s for F16 against 16.5 for 4 interleaved rows, from DRAM).
template <class T>
inline float dot_row_half(const T* w, const float* x, std::size_t in) {
  float part[32] = {};
  std::size_t j = 0;
#if KVD_CPU_AVX2
  using attention::detail::load8;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (; j + 32 <= in; j += 32) {
    a0 = _mm256_fmadd_ps(load8(w + j), _mm256_loadu_ps(x + j), a0);
    a1 = _mm256_fmadd_ps(load8(w + j + 8), _mm256_loadu_ps(x + j + 8), a1);
    a2 = _mm256_fmadd_ps(load8(w + j + 16), _mm256_loadu_ps(x + j + 16), a2);
    a3 = _mm256_fmadd_ps(load8(w + j + 24), _mm256_loadu_ps(x + j + 24), a3);
  }
  if (j == in) return sum_lanes(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  _mm256_storeu_ps(part, a0);
  _mm256_storeu_ps(part + 8, a1);
  _mm256_storeu_ps(part + 16, a2);
  _mm256_storeu_ps(part + 24, a3);
#endif
  for (; j < in; ++j) part[j % 32] = std::fma(weight_value(w[j]), x[j], part[j % 32]);
  float lanes[8];
  for (int l = 0; l < 8; ++l) lanes[l] = (part[l] + part[l + 8]) + (part[l + 16] + part[l + 24]);
  return sum_lanes(lanes);
}

// ---- row drivers ------------------------------------------------------------------------------

using TileFn = void (*)(const std::byte* const*, const ActRow*, std::int64_t, float*);

/// The tiles of one quantized type: decode (one row, one input) and prefill (kRows rows x kInputs
/// inputs; inputs left over take the decode tile).
///
/// Measured on the development machine (2 cores of an AMD EPYC Zen 5, single thread, a sweep of
/// R rows x C inputs): decode is fastest one row at a time, a single sequential stream through
/// the matrix that the hardware prefetcher follows: from DRAM (16384 x 4096) Q8_0 ran at 27 GB/s
/// with 1 row against 7 / 12 / 16 with 2 / 4 / 8 interleaved rows, Q4_1 at 18 against 4 / 5 / 5,
/// Q6_K at 25 against 7 / 8 (from the caches several rows gained at most 10-20 %). Prefill
/// (256 inputs x 512 x 2048) is fastest at 1 x 4 or 1 x 8 (Q4_1 42 / 43 GMAC/s, Q8_0 52 / 53,
/// Q4_K 57 / 57, Q6_K 55 / 60), ahead of 2 x 4, 2 x 2, 4 x 2 (Q4_1 40, 37, 32); 1 x 4 wastes
/// fewer inputs on small chunks.
struct Tiles {
  static constexpr int kRows = 1, kInputs = 4;
  TileFn decode = nullptr, prefill = nullptr;
};

/// The tiles of a quantized type.
inline const Tiles& tiles(GgmlType t) {
  static const Tiles q4_0{tile_q32<Q4_0Block, 1, 1>, tile_q32<Q4_0Block, 1, Tiles::kInputs>};
  static const Tiles q4_1{tile_q32<Q4_1Block, 1, 1>, tile_q32<Q4_1Block, 1, Tiles::kInputs>};
  static const Tiles q5_0{tile_q32<Q5_0Block, 1, 1>, tile_q32<Q5_0Block, 1, Tiles::kInputs>};
  static const Tiles q5_1{tile_q32<Q5_1Block, 1, 1>, tile_q32<Q5_1Block, 1, Tiles::kInputs>};
  static const Tiles q8_0{tile_q32<Q8_0Block, 1, 1>, tile_q32<Q8_0Block, 1, Tiles::kInputs>};
  static const Tiles q4_k{tile_qk45<false, 1, 1>, tile_qk45<false, 1, Tiles::kInputs>};
  static const Tiles q5_k{tile_qk45<true, 1, 1>, tile_qk45<true, 1, Tiles::kInputs>};
  static const Tiles q6_k{tile_q6k<1, 1>, tile_q6k<1, Tiles::kInputs>};
  switch (t) {
    case GgmlType::Q4_0: return q4_0;
    case GgmlType::Q4_1: return q4_1;
    case GgmlType::Q5_0: return q5_0;
    case GgmlType::Q5_1: return q5_1;
    case GgmlType::Q8_0: return q8_0;
    case GgmlType::Q4_K: return q4_k;
    case GgmlType::Q5_K: return q5_k;
    case GgmlType::Q6_K: return q6_k;
    default: fail("GGML type {} is not a quantized type with block kernels", ggml_type_name(t));
  }
}

/// y[i * w.rows + r] = W[r] . input i for the rows [r0, r1) and the inputs [0, n) of `acts`:
/// groups of Tiles::kInputs inputs by the prefill tile (each weight block decoded once for the
/// group), the inputs left over (and decode) by the decode tile.
inline void quantized_rows(const Matrix& w, const QuantizedActs& acts, std::size_t n, float* y, std::int64_t r0,
                           std::int64_t r1) {
  static_assert(Tiles::kRows == 1);
  constexpr std::size_t kC = Tiles::kInputs;
  const Tiles& t = tiles(w.type);
  const std::size_t rb = w.row_bytes(), ldy = static_cast<std::size_t>(w.rows);
  const std::int64_t nb = acts.blocks_per_row();
  ActRow a[kC];
  float out[kC];
  std::size_t i = 0;
  for (; i + kC <= n; i += kC) {
    for (std::size_t c = 0; c < kC; ++c) a[c] = acts.row(i + c);
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::byte* row = w.data + static_cast<std::size_t>(r) * rb;
      t.prefill(&row, a, nb, out);
      for (std::size_t c = 0; c < kC; ++c) y[(i + c) * ldy + static_cast<std::size_t>(r)] = out[c];
    }
  }
  for (; i < n; ++i) {
    a[0] = acts.row(i);
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::byte* row = w.data + static_cast<std::size_t>(r) * rb;
      t.decode(&row, a, nb, out);
      y[i * ldy + static_cast<std::size_t>(r)] = out[0];
    }
  }
}

/// Row `row` of W . one activation row, by the one-row one-input tile (what every tile computes
/// for each of its rows and inputs).
inline float row_dot(const Matrix& w, std::int64_t row, const ActRow& a) {
  const std::byte* r = w.row(row);
  const std::int64_t nb = w.cols / ggml_type_traits(w.type).block_elems;
  float out = 0;
  switch (w.type) {
    case GgmlType::Q4_0: tile_q32<Q4_0Block, 1, 1>(&r, &a, nb, &out); break;
    case GgmlType::Q4_1: tile_q32<Q4_1Block, 1, 1>(&r, &a, nb, &out); break;
    case GgmlType::Q5_0: tile_q32<Q5_0Block, 1, 1>(&r, &a, nb, &out); break;
    case GgmlType::Q5_1: tile_q32<Q5_1Block, 1, 1>(&r, &a, nb, &out); break;
    case GgmlType::Q8_0: tile_q32<Q8_0Block, 1, 1>(&r, &a, nb, &out); break;
    case GgmlType::Q4_K: tile_qk45<false, 1, 1>(&r, &a, nb, &out); break;
    case GgmlType::Q5_K: tile_qk45<true, 1, 1>(&r, &a, nb, &out); break;
    case GgmlType::Q6_K: tile_q6k<1, 1>(&r, &a, nb, &out); break;
    default: fail("row_dot: GGML type {} is not a quantized type with block kernels", ggml_type_name(w.type));
  }
  return out;
}

}  // namespace kvdrive::llama::quant
