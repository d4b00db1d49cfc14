// A model's weight matrices decoded to float (kvd-llama --weights f32): every GGUF block format
// dequantized once, so that the projections take float activations instead of quantizing them
// per block. Slower and four to eight times the memory of Q4 blocks, but free of the activations'
// rounding: the reference decoder's exact mode, which test_smollm2 holds to an fp32 reference.
#pragma once

#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "model/model.hpp"
#include "kernels/quant.hpp"

namespace kvdrive::llama {

/// `m` with every non-float matrix replaced by its float decoding (shared matrices, such as tied
/// embeddings, decoded once).
inline Model with_f32_weights(Model m) {
  std::map<const std::byte*, Matrix> done;
  const auto convert = [&](Matrix& w) {
    if (!w || w.is_f32()) return;
    if (auto it = done.find(w.data); it != done.end()) {
      w = it->second;
      return;
    }
    auto& v = m.owned.emplace_back(static_cast<std::size_t>(w.rows) * static_cast<std::size_t>(w.cols));
    const std::size_t rb = w.row_bytes();
    for (std::int64_t r = 0; r < w.rows; ++r)
      dequantize_row(w.type, w.data + static_cast<std::size_t>(r) * rb, v.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(w.cols),
                     w.cols);
    const Matrix f = Matrix::f32(v.data(), w.rows, w.cols);
    done.emplace(w.data, f);
    w = f;
  };
  convert(m.token_embedding);
  convert(m.classifier);
  for (LayerWeights& l : m.layers)
    for (Matrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3}) convert(*w);
  m.weight_types = "F32 (decoded from " + (m.weight_types.empty() ? std::string("F32") : m.weight_types) + ")";
  return m;
}

}  // namespace kvdrive::llama
