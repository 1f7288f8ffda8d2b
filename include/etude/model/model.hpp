// etude::model<Shape, Pattern, Conditions>: the compile-time description of a MusicGen-style LM —
// shape, codebook pattern, what it is conditioned on (config/conditions.hpp; none by default),
// parameter and activation tables — and the one place that validates them.
// It holds no storage and does no arithmetic (see model/transformer.hpp and train/trainer.hpp).
#pragma once

#include <type_traits>

#include "etude/config/conditions.hpp"
#include "etude/config/pattern.hpp"
#include "etude/config/shape.hpp"
#include "etude/model/activations.hpp"
#include "etude/model/params.hpp"

namespace etude {

template <class P>
concept codebook_pattern = requires(int k, index_t t) {
  { P::codebooks } -> std::convertible_to<int>;
  { P::accepts(k) } -> std::same_as<bool>;
  { P::steps(k, t) } -> std::same_as<index_t>;
  { P::layout(k, t) } -> std::same_as<pattern::layout_t>;
};

template <shape Shape, class Pattern = pattern::delay<0, 1, 2, 3>, class Conditions = no_conditions>
struct model {
  static_assert(is_conditions<Conditions>,
                "etude::model: the third argument must be etude::conditions<...> (conditions and a fuser) or "
                "etude::no_conditions");
  static_assert(codebook_pattern<Pattern>,
                "etude::model: the second argument must be a codebook pattern from etude::pattern "
                "(delay<...>, parallel, flatten, grouped<...>, coarse_first<...>, musiclm<N>)");
  static_assert(Shape.codebooks > 0, "shape.codebooks must be at least 1");
  static_assert(Shape.card > 1, "shape.card must be at least 2 (entries per codebook)");
  static_assert(Shape.dim > 0 && Shape.heads > 0 && Shape.layers > 0,
                "shape.dim, shape.heads and shape.layers must be positive");
  static_assert(Shape.dim % Shape.heads == 0, "shape.dim must be a multiple of shape.heads: change dim or heads");
  static_assert(Shape.dim % 2 == 0 && Shape.dim >= 4,
                "shape.dim must be even and at least 4 (sinusoidal positions split it in cos and sin halves)");
  static_assert(Shape.ffn_mult > 0, "shape.ffn_mult must be positive (MusicGen uses 4)");
  static_assert(Shape.max_len > 1, "shape.max_len must allow at least 2 sequence steps");
  static_assert(Pattern::accepts(Shape.codebooks),
                "the codebook pattern does not fit shape.codebooks: delay<...> and grouped<...> need one entry "
                "per codebook, coarse_first<...> K-1 delays, musiclm<N> a codebook count divisible by N");
  static_assert(static_cast<index_t>(Shape.codebooks) * Shape.card < (index_t{1} << 31),
                "shape.codebooks * shape.card must stay below 2^31 (token ids are 32-bit)");

  static constexpr etude::shape shape = Shape;
  using pattern = Pattern;
  using conditions = Conditions;
  static constexpr fuse::method fusion = fusion_of<Conditions>();
  static constexpr bool conditioned = Conditions::count > 0;
  using params = param_table<Shape, Conditions>;
  // A trainer's table with low-rank adapters (config/adapt.hpp) in front of the model's tensors.
  template <class Adapt>
  using adapted_params = param_table<Shape, Conditions, Adapt>;
  using activations = activation_table<Shape, fusion == fuse::method::cross>;

  // Condition positions in front of the tokens (fuse::prepend; 0 otherwise): the transformer runs
  // over prefix + S positions, all of which must fit shape.max_len.
  static constexpr index_t prefix = prepended_positions<Conditions>();

  // Frames that fit in shape.max_len positions: the pattern steps, after any prepended conditions.
  static constexpr index_t max_frames() {
    index_t lo = 0, hi = Shape.max_len;
    while (lo < hi) {
      const index_t mid = (lo + hi + 1) / 2;
      if (prefix + Pattern::steps(Shape.codebooks, mid) <= Shape.max_len) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
  static_assert(prefix == 0 || max_frames() >= 1,
                "shape.max_len is too short for even one frame after the condition positions fuse::prepend puts in "
                "front of the tokens (Conditions::positions): raise max_len or shorten the conditions");
  static_assert(max_frames() >= 1, "shape.max_len is too short for even one frame with this pattern: raise max_len");

  // Matrix-multiply FLOPs of one forward pass per token position (2 per multiply-add), and the
  // attention FLOPs per position at sequence length s (QK^T and PV, causal half not discounted).
  static constexpr double matmul_params() {
    const double d = Shape.dim, f = Shape.ffn();
    // cross-attention's query and out projections run per position; its keys and values per
    // condition position, which is not counted here
    const double cross = fusion == fuse::method::cross ? 2 * d * d : 0.0;
    return Shape.layers * (4 * d * d + 2 * d * f + cross) + static_cast<double>(Shape.codebooks) * Shape.card * d;
  }
  // The training FLOPs of one step over `positions` token positions of length s:
  // 6 N per position for the matrices, 12 L s D per position for attention (PaLM's count).
  static constexpr double train_flops(double positions, double s) {
    return 6.0 * matmul_params() * positions + 12.0 * Shape.layers * s * Shape.dim * positions;
  }
};

}  // namespace etude
