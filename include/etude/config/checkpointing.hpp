// Activation-checkpointing policies: which of a layer's saved activations (config/activation_slots.hpp)
// are kept from the forward pass and which the backward pass recomputes. The options AudioCraft
// and llm.c offer, as types:
//
//   none           keep everything (fastest, most memory)
//   every_layer    keep only each layer's input; backward re-runs the layer's forward
//   every_nth<N>   as every_layer for layers 0, N, 2N, …; the others keep everything
//   selective      keep matrix products and attention outputs; recompute the LayerNorm outputs
//                  (from the kept input and statistics) and the GELU output (from its input)
//   selective_ffn  selective, and also recompute the FFN up-projection (one more gemm)
//
// Recomputation runs the same ops on the same inputs, so gradients are bit-identical to `none`.
// Not for: the recomputation itself (model/transformer.hpp) or the byte layout and counts
// (model/activations.hpp, train/memory_plan.hpp).
#pragma once

#include <string>

#include "etude/config/activation_slots.hpp"

namespace etude::checkpointing {

struct policy_tag {};

struct none : policy_tag {
  static constexpr const char* name = "none";
  static constexpr bool recompute_layer(int) { return false; }
  static constexpr bool keeps(layer_slot) { return true; }
};

template <int N>
struct every_nth : policy_tag {
  static_assert(N >= 1, "checkpointing::every_nth<N>: N must be >= 1 (every_nth<1> is every_layer)");
  static constexpr int n = N;
  static constexpr const char* name = "every_nth";
  static constexpr bool recompute_layer(int layer) { return layer % N == 0; }
  static constexpr bool keeps(layer_slot) { return true; }
};

struct every_layer : every_nth<1> {
  static constexpr const char* name = "every_layer";
};

struct selective : policy_tag {
  static constexpr const char* name = "selective";
  static constexpr bool recompute_layer(int) { return false; }
  static constexpr bool keeps(layer_slot s) {
    return s != layer_slot::ln1 && s != layer_slot::lnc && s != layer_slot::ln2 && s != layer_slot::ffn_act;
  }
};

struct selective_ffn : policy_tag {
  static constexpr const char* name = "selective_ffn";
  static constexpr bool recompute_layer(int) { return false; }
  static constexpr bool keeps(layer_slot s) { return selective::keeps(s) && s != layer_slot::ffn_pre; }
};

// Spelling for run records: "every_nth<3>", "selective", ...
template <class P>
std::string describe() {
  if constexpr (requires { P::n; }) {
    if constexpr (P::n == 1) return "every_layer";
    else return "every_nth<" + std::to_string(P::n) + ">";
  } else {
    return P::name;
  }
}

}  // namespace etude::checkpointing
