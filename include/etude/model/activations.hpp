// The activation table: what each layer's backward needs, declared once. Every saved tensor has
// one row per token position (B·S rows), so a slot is just a width in floats; the trainer lays
// the buffer out from this table, and the memory plan counts the same declarations. An
// activation-checkpoint policy decides per slot what is kept and what is recomputed.
#pragma once

#include <array>
#include <cstddef>

#include "etude/config/shape.hpp"
#include "etude/core/types.hpp"

namespace etude {

enum class layer_slot : unsigned char {
  x_in,      // (BS, D)  residual stream entering the layer
  ln1,       // (BS, D)  LayerNorm 1 output: qkv's input
  ln1_mean,  // (BS)
  ln1_rstd,  // (BS)
  qkv,       // (BS, 3D) packed q, k, v
  att,       // (BS, D)  attention output before the out projection
  att_lse,   // (BS, H)  log-sum-exp of each score row: backward recomputes probabilities
  x_mid,     // (BS, D)  residual stream after attention
  ln2,       // (BS, D)
  ln2_mean,  // (BS)
  ln2_rstd,  // (BS)
  ffn_pre,   // (BS, F)  up-projection output, GELU's input
  ffn_act,   // (BS, F)  GELU output: the down-projection's input
  count_
};

enum class final_slot : unsigned char {
  x_out,     // (BS, D) last layer's output
  lnf,       // (BS, D) final LayerNorm output: the heads' input
  lnf_mean,  // (BS)
  lnf_rstd,  // (BS)
  count_
};

template <shape S>
struct activation_table {
  static constexpr std::size_t layer_slots = static_cast<std::size_t>(layer_slot::count_);
  static constexpr std::size_t final_slots = static_cast<std::size_t>(final_slot::count_);

  static constexpr index_t width(layer_slot s) {
    switch (s) {
      case layer_slot::qkv: return 3 * S.dim;
      case layer_slot::att_lse: return S.heads;
      case layer_slot::ln1_mean:
      case layer_slot::ln1_rstd:
      case layer_slot::ln2_mean:
      case layer_slot::ln2_rstd: return 1;
      case layer_slot::ffn_pre:
      case layer_slot::ffn_act: return S.ffn();
      default: return S.dim;
    }
  }
  static constexpr index_t width(final_slot s) {
    return (s == final_slot::lnf_mean || s == final_slot::lnf_rstd) ? 1 : S.dim;
  }

  static constexpr index_t layer_width() {
    index_t w = 0;
    for (std::size_t i = 0; i < layer_slots; ++i) w += width(static_cast<layer_slot>(i));
    return w;
  }
  static constexpr index_t final_width() {
    index_t w = 0;
    for (std::size_t i = 0; i < final_slots; ++i) w += width(static_cast<final_slot>(i));
    return w;
  }
  // Floats saved per token position over the whole model.
  static constexpr index_t row_floats = layer_width() * S.layers + final_width();

  // Offset of a slot, in floats, inside a buffer laid out for `rows` token positions.
  static constexpr index_t offset(layer_slot s, int layer, index_t rows) {
    index_t w = 0;
    for (std::size_t i = 0; i < static_cast<std::size_t>(s); ++i) w += width(static_cast<layer_slot>(i));
    return rows * (layer_width() * layer + w);
  }
  static constexpr index_t offset(final_slot s, index_t rows) {
    index_t w = 0;
    for (std::size_t i = 0; i < static_cast<std::size_t>(s); ++i) w += width(static_cast<final_slot>(i));
    return rows * (layer_width() * S.layers + w);
  }
};

}  // namespace etude
