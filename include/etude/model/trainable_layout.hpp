// The layout of what trains (config/trainable.hpp) over a parameter table: which group each tensor
// belongs to, and where each trainable tensor's gradient and optimiser state live, packed in table
// order. The trainer allocates its gradients and moments from it and backward writes through it.
// Not for: the selection policies themselves (config/trainable.hpp).
#pragma once

#include <array>
#include <cstddef>

#include "etude/config/trainable.hpp"
#include "etude/core/types.hpp"
#include "etude/model/params.hpp"

namespace etude {

constexpr group group_of(param_kind k) {
  switch (k) {
    case param_kind::embedding: return group::embeddings;
    case param_kind::norm1_weight:
    case param_kind::norm1_bias:
    case param_kind::qkv:
    case param_kind::out_proj: return group::self_attention;
    case param_kind::norm2_weight:
    case param_kind::norm2_bias:
    case param_kind::ffn_up:
    case param_kind::ffn_down: return group::ffn;
    case param_kind::out_norm_weight:
    case param_kind::out_norm_bias:
    case param_kind::head: return group::output;
    case param_kind::cond_table:
    case param_kind::cond_proj:
    case param_kind::cond_bias: return group::conditions;
    case param_kind::norm_cross_weight:
    case param_kind::norm_cross_bias:
    case param_kind::cross_qkv:
    case param_kind::cross_out: return group::cross_attention;
    case param_kind::lora_a:
    case param_kind::lora_b: return group::adapters;
  }
  return group::embeddings;
}

// Where each trainable tensor's gradient (and optimiser state) lives: packed in table order, each
// tensor 16-float aligned as in the table, so that a run of consecutive trainable tensors is one
// contiguous range in both the weights and the gradients. Frozen tensors have none (offset −1).
// Under train_all the offsets are the table's own.
template <class Params, class Trainable>
struct trainable_layout {
  static constexpr std::size_t count = Params::count;
  static constexpr bool all = Trainable::all;

  // adapters (config/adapt.hpp) train whatever the selection says
  static constexpr bool trains(param_kind k) { return group_of(k) == group::adapters || Trainable::trains(group_of(k)); }
  static constexpr bool trains(std::size_t i) { return trains(Params::entries[i].kind); }

  static constexpr std::array<index_t, count> make_offsets() {
    std::array<index_t, count> o{};
    index_t at = 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (!trains(i)) {
        o[i] = -1;
        continue;
      }
      o[i] = at;
      at += detail::align16(Params::entries[i].numel());
    }
    return o;
  }
  static constexpr std::array<index_t, count> offsets = make_offsets();

  // Elements of the packed gradients (padding included), and of the trainable parameters.
  static constexpr index_t total_elements = [] {
    index_t n = 0;
    for (std::size_t i = 0; i < count; ++i)
      if (trains(i)) n += detail::align16(Params::entries[i].numel());
    return n;
  }();
  static constexpr index_t parameter_count() {
    index_t n = 0;
    for (std::size_t i = 0; i < count; ++i)
      if (trains(i)) n += Params::entries[i].numel();
    return n;
  }
  static_assert(total_elements > 0, "the trainable selection leaves no parameter of this model to train");
  static_assert(!all || total_elements == Params::total_elements, "train_all's layout is the table's");

  // The packed offset of a tensor (−1: frozen).
  static constexpr index_t offset_of(param_kind kind, int layer = -1, int codebook = -1) {
    return offsets[Params::index_of(kind, layer, codebook)];
  }
  static constexpr index_t offset_of(const param_desc& p) { return offsets[Params::index_of(p)]; }

  // Where backward's "the gradients of [offset, end) are final" from table tensor `i` onwards lands
  // in the packed layout: the first trainable tensor at or after i (the end when none is).
  static constexpr index_t final_from(std::size_t i) {
    for (std::size_t j = i; j < count; ++j)
      if (trains(j)) return offsets[j];
    return total_elements;
  }
  static constexpr index_t final_from(param_kind kind, int layer = -1, int codebook = -1) {
    return final_from(Params::index_of(kind, layer, codebook));
  }

  // Runs of consecutive trainable tensors: [weights, weights + length) in the table's layout is
  // [packed, packed + length) in the gradients'. train_all: one run, the whole table.
  struct run {
    index_t weights = 0, packed = 0, length = 0;
  };
  static constexpr std::size_t run_count = [] {
    std::size_t n = 0;
    for (std::size_t i = 0; i < count; ++i)
      if (trains(i) && (i == 0 || !trains(i - 1))) ++n;
    return n;
  }();
  static constexpr std::array<run, run_count> runs = [] {
    std::array<run, run_count> r{};
    std::size_t n = 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (!trains(i)) continue;
      const index_t len = detail::align16(Params::entries[i].numel());
      if (i == 0 || !trains(i - 1)) r[n++] = run{Params::entries[i].offset, offsets[i], 0};
      r[n - 1].length += len;
    }
    return r;
  }();

  // A frozen LayerNorm's parameter gradients (weight, bias) are written to a sink of 2·dim values
  // after the packed gradients, cleared with them and read by nothing; the gradient buffers hold
  // both (gradient_elements).
  static constexpr bool is_norm_bias(param_kind k) {
    return k == param_kind::norm1_bias || k == param_kind::norm2_bias || k == param_kind::norm_cross_bias ||
           k == param_kind::out_norm_bias;
  }
  static constexpr bool is_norm(param_kind k) {
    return is_norm_bias(k) || k == param_kind::norm1_weight || k == param_kind::norm2_weight ||
           k == param_kind::norm_cross_weight || k == param_kind::out_norm_weight;
  }
  static constexpr index_t norm_width = Params::at(param_kind::out_norm_weight).numel();  // every norm is dim wide
  static constexpr bool sinks_norms = [] {
    for (std::size_t i = 0; i < count; ++i)
      if (!trains(i) && is_norm(Params::entries[i].kind)) return true;
    return false;
  }();
  static constexpr index_t gradient_elements = total_elements + (sinks_norms ? detail::align16(2 * norm_width) : 0);
  // Where a frozen LayerNorm's weight or bias gradient goes: the sink's first or second half.
  static constexpr index_t sink_offset(param_kind k) { return total_elements + (is_norm_bias(k) ? norm_width : 0); }
};

}  // namespace etude
