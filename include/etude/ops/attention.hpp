// Spec of causal multi-head self-attention over packed projections.
//
//   attention_scratch(S, hd, staged, threads) -> index_t
//       compute-type values of scratch the two ops need for sequences of S (0: none); staged when
//       a tensor is stored in 16 bits.
//   attention_fwd(att (B·S, D), lse (B·S, H), qkv (B·S, 3D), B, S, H, hd, scratch, size)
//       att = softmax(q·kᵀ/sqrt(hd), causal)·v per (sequence, head) (=); lse: each score row's
//       log-sum-exp in the compute type, kept for the backward. qkv rows hold q, k, v, each D = H·hd
//       wide with head h at columns h·hd.
//   attention_bwd(dqkv (B·S, 3D), datt, att, qkv, lse, B, S, H, hd, scratch, size)
//       dqkv = attention'(datt) (=), the probabilities recomputed from q, k and lse. att is the
//       forward's output, which the model has at that point: a backend may take the row terms
//       dO·O from it instead of recomputing them (CUDA does; the CPU forms them from P and dP).
// The CUDA kernels exist for listed head dimensions (backend::cuda::head_dims); a configuration
// with another stops the build there.
#pragma once

#include <concepts>

#include "etude/core/types.hpp"

namespace etude::ops {

template <class B, class Policy>
concept attention_op = requires(typename Policy::activation_t* a, typename Policy::compute_t* f, index_t n, int h,
                                bool staged) {
  { B::attention_scratch(n, n, staged, h) } -> std::convertible_to<index_t>;
  B::attention_fwd(a, f, a, n, n, h, n, f, n);
  B::attention_bwd(a, a, a, a, f, n, n, h, n, f, n);
};

}  // namespace etude::ops
