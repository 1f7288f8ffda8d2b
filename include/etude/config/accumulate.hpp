// Gradient accumulation policy: how many microbatches make one optimiser step, and how their
// losses are normalised.
#pragma once

namespace etude {

enum class loss_norm {
  // Each codebook's loss is divided by its valid target tokens over all microbatches of the step
  // (and ranks): accumulating 4 microbatches of 2 is the same update as one batch of 8, padding
  // or not. etude's default.
  tokens,
  // Each microbatch's loss is its own mean (AudioCraft's convention); the step averages them.
  // Kept for exact comparison with the reference.
  mean_of_means,
};

struct accumulate_tag {};

template <int Microbatches, loss_norm Norm = loss_norm::tokens>
struct accumulate : accumulate_tag {
  static_assert(Microbatches >= 1, "accumulate<N>: N (microbatches per optimiser step) must be at least 1");
  static constexpr int microbatches = Microbatches;
  static constexpr loss_norm norm = Norm;
};

}  // namespace etude
