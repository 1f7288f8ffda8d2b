// The seam between generation and conditioning. A Conditions policy tells the generator
// (generate/generator.hpp) whether the model has conditions and what one sample's condition is;
// with classifier-free guidance (cfg_coef != 1) the generator decodes 2B rows, the B samples'
// conditions then B null conditions, feeds both halves the same tokens, and samples from
// uncond + (cond − uncond) · coef. What a policy supplies:
//   static constexpr bool present          the model reads conditions
//   using input = ...                      one sample's condition (the conditioned model's type)
//   static input null_input()              the dropped condition (AudioCraft's null: zeros)
//   template <class Decoder> static void bind(Decoder&, std::span<const input> rows)
//                                          makes the decoder's layers read rows[i] for row i
// The unconditioned LM uses no_conditions, and a generator on it refuses cfg_coef != 1.
// Not for: condition tables, encoders or cross-attention themselves (the conditioned model).
#pragma once

#include <span>

namespace etude {

struct no_conditions {
  static constexpr bool present = false;
  struct input {};
  static input null_input() { return {}; }
  template <class Decoder>
  static void bind(Decoder&, std::span<const input>) {}
};

}  // namespace etude
