// The activation table: what each layer's backward needs, declared once. Every saved tensor has
// one row per token position (B·S rows), so a slot is just a width in floats; the trainer lays
// the buffer out from this table, and the memory plan counts the same declarations. An
// activation-checkpoint policy decides per slot what is kept and what is recomputed.
// activation_layout turns the table, a checkpoint policy and the storage dtypes into byte
// offsets: the trainer's arena and the memory plan both read them.
#pragma once

#include <array>
#include <cstddef>

#include "etude/config/activation_slots.hpp"
#include "etude/config/shape.hpp"
#include "etude/core/arena.hpp"
#include "etude/core/types.hpp"

namespace etude {

// Cross: the model has cross-attention (fuse::cross); without it its slots have width 0.
template <shape S, bool Cross = false>
struct activation_table {
  static constexpr std::size_t layer_slots = static_cast<std::size_t>(layer_slot::count_);
  static constexpr std::size_t final_slots = static_cast<std::size_t>(final_slot::count_);

  static constexpr bool is_cross(layer_slot s) {
    return s == layer_slot::x_sa || s == layer_slot::lnc || s == layer_slot::lnc_mean || s == layer_slot::lnc_rstd ||
           s == layer_slot::qc || s == layer_slot::attc || s == layer_slot::attc_lse;
  }
  static constexpr index_t width(layer_slot s) {
    if (!Cross && is_cross(s)) return 0;
    switch (s) {
      case layer_slot::qkv: return 3 * S.dim;
      case layer_slot::att_lse:
      case layer_slot::attc_lse: return S.heads;
      case layer_slot::ln1_mean:
      case layer_slot::ln1_rstd:
      case layer_slot::lnc_mean:
      case layer_slot::lnc_rstd:
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
};

// Per-row statistics (LayerNorm mean and 1/std, attention log-sum-exp) stay in the compute type
// whatever the activation dtype; everything else is stored as the policy's activation_t.
constexpr bool is_statistic(layer_slot s) {
  return s == layer_slot::ln1_mean || s == layer_slot::ln1_rstd || s == layer_slot::att_lse ||
         s == layer_slot::lnc_mean || s == layer_slot::lnc_rstd || s == layer_slot::attc_lse ||
         s == layer_slot::ln2_mean || s == layer_slot::ln2_rstd;
}
constexpr bool is_statistic(final_slot s) { return s == final_slot::lnf_mean || s == final_slot::lnf_rstd; }

// Byte layout of the activations for `rows` token positions under checkpoint policy Ckpt
// (config/checkpointing.hpp: recompute_layer(l), keeps(slot)). Two regions:
//   saved: per layer, the slots kept for backward, then the final slots;
//   work:  the slots of one layer that are not kept, reused layer after layer (forward writes
//          them there and moves on; backward recomputes them there before it needs them).
// Every slot starts on an arena boundary (64 bytes).
template <shape S, class Act, class Stat, class Ckpt, bool Cross = false>
struct activation_layout {
  using table = activation_table<S, Cross>;
  static constexpr index_t round_up(index_t bytes) { return arena::round_up(bytes); }

  static constexpr bool kept(layer_slot s, int layer) {
    return Ckpt::recompute_layer(layer) ? s == layer_slot::x_in : Ckpt::keeps(s);
  }
  static constexpr index_t bytes(layer_slot s, index_t rows) {
    return round_up(rows * table::width(s) * static_cast<index_t>(is_statistic(s) ? sizeof(Stat) : sizeof(Act)));
  }
  static constexpr index_t bytes(final_slot s, index_t rows) {
    return round_up(rows * table::width(s) * static_cast<index_t>(is_statistic(s) ? sizeof(Stat) : sizeof(Act)));
  }
  static constexpr layer_slot slot(std::size_t i) { return static_cast<layer_slot>(i); }

  // Bytes layer l keeps, and the bytes of its slots that live in the work region.
  static constexpr index_t layer_saved_bytes(int layer, index_t rows) {
    index_t b = 0;
    for (std::size_t i = 0; i < table::layer_slots; ++i)
      if (kept(slot(i), layer)) b += bytes(slot(i), rows);
    return b;
  }
  static constexpr index_t layer_work_bytes(int layer, index_t rows) {
    index_t b = 0;
    for (std::size_t i = 0; i < table::layer_slots; ++i)
      if (!kept(slot(i), layer)) b += bytes(slot(i), rows);
    return b;
  }

  // Offset of slot s of layer l: inside the saved region when kept, else inside the work region.
  static constexpr index_t offset(layer_slot s, int layer, index_t rows) {
    index_t b = 0;
    if (kept(s, layer))
      for (int l = 0; l < layer; ++l) b += layer_saved_bytes(l, rows);
    for (std::size_t i = 0; i < static_cast<std::size_t>(s); ++i)
      if (kept(slot(i), layer) == kept(s, layer)) b += bytes(slot(i), rows);
    return b;
  }
  static constexpr index_t offset(final_slot s, index_t rows) {
    index_t b = 0;
    for (int l = 0; l < S.layers; ++l) b += layer_saved_bytes(l, rows);
    for (std::size_t i = 0; i < static_cast<std::size_t>(s); ++i) b += bytes(static_cast<final_slot>(i), rows);
    return b;
  }

  static constexpr index_t saved_bytes(index_t rows) { return offset(static_cast<final_slot>(table::final_slots), rows); }
  static constexpr index_t work_bytes(index_t rows) {
    index_t b = 0;
    for (int l = 0; l < S.layers; ++l) b = layer_work_bytes(l, rows) > b ? layer_work_bytes(l, rows) : b;
    return b;
  }
};

}  // namespace etude
