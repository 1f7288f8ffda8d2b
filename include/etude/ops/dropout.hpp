// Spec of dropout with a counter-based mask: whether an element is kept is a function of the
// pass's key, the site (which tensor), the row's index in the global batch and the column, so a
// recomputation, a backward pass, a CUDA kernel and the CPU all see the same mask with nothing
// stored, and neither the split into microbatches nor into ranks changes it.
//
//   dropout(y (R, N), ldy, x (R, N), ldx, R, N, key, site, row0, accumulate)
//       y[r, j] = m·x[r, j]   (accumulate: y[r, j] += m·x[r, j], added in the compute type and
//       rounded once), m = key->scale where dropout_keeps(*key, site, row0 + r, j), else 0.
//       x·scale is computed in the compute type of y (float for 16-bit and float tensors).
//       key is read when the op runs (a captured graph reads the step's key from device memory).
//
// The low-rank adapters' input dropout (PEFT's lora_dropout: model/transformer.hpp) is its user:
// site names the adapter (target, layer, codebook); rows are the microbatch's positions offset by
// its first example's, in the global batch.
#pragma once

#include <concepts>
#include <cstdint>

#include "etude/core/types.hpp"

namespace etude::ops {

// A pass's dropout: kept where the element's 32-bit draw is at least `threshold` (p·2^32), the
// kept values scaled by 1/(1 − p). Written by the host before each training step.
struct dropout_scalars {
  std::uint64_t stream = 0;    // the run's seed and the step's draw, mixed
  std::uint32_t threshold = 0;
  double scale = 1.0;          // 1/(1 − p), rounded to the compute type where it is used
};

ETUDE_HOST_DEVICE inline std::uint64_t dropout_mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The site of an adapter's dropout: its target (config/adapt.hpp's enum value), layer and
// codebook (−1: none).
ETUDE_HOST_DEVICE inline std::uint64_t dropout_site(int target, int layer, int codebook) {
  return (static_cast<std::uint64_t>(target) + 1) | (static_cast<std::uint64_t>(layer + 1) << 16) |
         (static_cast<std::uint64_t>(codebook + 1) << 40);
}

// The row's half of the draw (computed once per row), then the element's.
ETUDE_HOST_DEVICE inline std::uint64_t dropout_row(const dropout_scalars& key, std::uint64_t site, index_t row) {
  return dropout_mix(dropout_mix(key.stream ^ dropout_mix(site)) + static_cast<std::uint64_t>(row));
}
ETUDE_HOST_DEVICE inline bool dropout_keeps(std::uint64_t row_draw, const dropout_scalars& key, index_t col) {
  return static_cast<std::uint32_t>(dropout_mix(row_draw + static_cast<std::uint64_t>(col)) >> 32) >= key.threshold;
}
ETUDE_HOST_DEVICE inline bool dropout_keeps(const dropout_scalars& key, std::uint64_t site, index_t row, index_t col) {
  return dropout_keeps(dropout_row(key, site, row), key, col);
}

// The key of a training step: p in [0, 1), the run's seed and the step's draw (updates applied
// plus skipped, so a resumed run draws the same masks).
inline dropout_scalars dropout_key(double p, std::uint64_t seed, std::uint64_t draw) {
  dropout_scalars k;
  k.stream = dropout_mix(seed ^ 0x1a0d2d0f5ULL) + dropout_mix(draw);
  const double t = p * 4294967296.0;
  k.threshold = t >= 4294967295.0 ? 0xffffffffU : static_cast<std::uint32_t>(t);
  k.scale = 1.0 / (1.0 - p);
  return k;
}

template <class B, class Policy>
concept dropout_op = requires(typename Policy::activation_t* a, const dropout_scalars* key, std::uint64_t site,
                              index_t n) {
  B::dropout(a, n, static_cast<const typename Policy::activation_t*>(a), n, n, n, key, site, n, true);
};

}  // namespace etude::ops
