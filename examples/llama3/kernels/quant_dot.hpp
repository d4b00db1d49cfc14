// The decoder's projections computed straight from GGUF blocks (quant.hpp defines the formats).
//
// Activations are quantized per block, the way the weights' integer parts can meet them:
//   Q16x32  for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: blocks of 32 int16 with a float scale
//           d = max|x| / 32767 (q = x / d rounded to nearest even), and d * (the sum of the
//           block's q), which the formats with a minimum meet;
//   Q8x256  for Q4_K, Q5_K, Q6_K: blocks of 256 int8 with one float scale and the sums of q over
//           each 16 values (the K-quants' minimums and Q6_K's -32 offset become one integer dot
//           of the sub-block scales with these sums, so a 256-value block costs two fmas);
//   F32, F16 and BF16 weights take the float activations.
// Float activations meeting weights dequantized on the fly ran at about half the speed (decode,
// one thread: Q4_1 10 against 18 GB/s, Q8_0 16-18 against 30).
// Why 16 bits for the 32-value formats: with int8 (d = max|x| / 127, what llama.cpp's Q8_0 and
// Q8_1 do), each of SmolLM2-135M's Q4_1 products was 0.6-1.9 % off (||W x~ - W x|| / ||W x||,
// on an fp32 reference pass's own activations; llama.cpp's scheme the same to 3 digits) and the
// Q8_0 head's logits 0.055 (rms), so greedy decoding left the fp32 reference's ids at its
// near-ties (margins 0.00-0.2) after 2-20 tokens on 8 of 12 licence prompts, as llama.cpp does
// (scripts/fidelity-greedy.py). With int16 the products are 0.003-0.007 % off, and 11 of the 12
// prompts keep all 24 reference ids (the twelfth 18, to a 0.004 near-tie). The int16 dot costs about what the int8
// one did (two madd_epi16 against maddubs + madd): SmolLM2's products in one thread (CPU time,
// best of 25, 4 alternating runs, after against before): prefill (128 inputs) 75-76 against 77-78
// ms, decode 11.2-11.5 against 10.6-11.0 ms for the layers, 4.3-4.5 against 4.2-4.3 ms for the
// head. Per-32 scales for the K-quants' activations would cost 8 fmas a 256-value block instead
// of 2.
//
// A weight block's integer dot with an activation block is exact (madd_epi16 for Q16x32,
// maddubs + madd for Q8x256 on AVX2, int loops in the portable code). Each (row, input) keeps 8
// float lanes. Per block (tile_q32, tile_qk45, tile_q6k say exactly):
//   Q4_0, Q5_0, Q8_0  lane = fma(dw * dx, I_l, lane)           } blocks of even and odd index
//   Q4_1, Q5_1        lane = fma(dw * dx, I_l, lane)           } in two sets of lanes, and of
//                     min = fma(m, s, min)                     } minimum terms
//                     (s = dx * the sum of the block's q)
//   Q4_K, Q5_K        lane = fma(d * dx, I_l, lane); lane = fma(-(dmin * dx), m_l * S_l, lane)
//                     (S_l = the sum of sub-block l's q)
//   Q6_K              lane = fma(d * dx, I_l - 32 * (scales . sums of 16)_l, lane)
// and at the end the lanes are added in one fixed order (sum_lanes), then the minimum terms. The
// portable code computes the same integers and the same fmas in the same order (std::fma; no
// product of this code meets an add the compiler could contract it with), so both paths give the
// same floats bit for bit. Every (row, input) is computed on its own, whatever the tile or the
// thread: results do not depend on the thread count, and matmul's result for an input equals
// matvec's.
//
// Tiles (rows x inputs, chosen by measurement, see Tiles): decode one row at a time, prefill one
// row x 4 inputs, each weight block decoded once for the 4. Every tile asks for the weight bytes
// kPrefetchAhead (4 KiB) beyond the block it reads (quant_dot_common.hpp says what that bought).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/quant.hpp"
#include "kernels/quant_dot_acts.hpp"    // the activations: Q16x32, Q8x256
#include "kernels/quant_dot_common.hpp"  // scale_f16, sum_lanes, AVX2 nibbles and bit masks
#include "kernels/quant_dot_float.hpp"   // F32, F16, BF16 weights
#include "kernels/quant_dot_q32.hpp"     // Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
#include "kernels/quant_dot_q6k.hpp"     // Q6_K
#include "kernels/quant_dot_qk45.hpp"    // Q4_K, Q5_K

namespace kvdrive::llama::quant {

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
inline void quantized_rows(const Matrix& w, const QuantizedActs& acts, std::size_t n, float* y, std::int64_t r0, std::int64_t r1) {
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
