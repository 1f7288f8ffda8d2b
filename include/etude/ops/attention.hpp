// Spec of causal multi-head self-attention over packed projections.
//
//   attention_scratch(S, hd, staged, threads) -> index_t
//       compute-type values of scratch the two ops need for sequences of S (0: none); staged when
//       a tensor is stored in 16 bits.
//   attention_fwd<hd>(att (B·S, D), lse (B·S, H), qkv (B·S, 3D), B, S, H, scratch, size)
//       att = softmax(q·kᵀ/sqrt(hd), causal)·v per (sequence, head) (=); lse: each score row's
//       log-sum-exp in the compute type, kept for the backward. qkv rows hold q, k, v, each D = H·hd
//       wide with head h at columns h·hd.
//   attention_bwd<hd>(dqkv (B·S, 3D), datt, att, qkv, lse, B, S, H, scratch, size)
//       dqkv = attention'(datt) (=), the probabilities recomputed from q, k and lse. att is the
//       forward's output, which the model has at that point: a backend may take the row terms
//       dO·O from it instead of recomputing them (CUDA does; the CPU forms them from P and dP).
// The head dimension hd = D / H is a template argument: the model's shape chooses the kernel at
// compile time. CUDA's kernels exist for the head dimensions listed in
// etude::cuda::attention_head_dims (backend/cuda/tuning.cuh); a configuration with another stops
// the build there (backend::cuda::accepts). The CPU takes any.
#pragma once

#include <concepts>

#include "etude/core/types.hpp"

namespace etude::ops {

template <class B, class Policy>
concept attention_op = requires(typename Policy::activation_t* a, typename Policy::compute_t* f, index_t n, int h,
                                bool staged) {
  { B::attention_scratch(n, n, staged, h) } -> std::convertible_to<index_t>;
  // checked at head dimension 64, which every backend supports
  B::template attention_fwd<64>(a, f, a, n, n, h, f, n);
  B::template attention_bwd<64>(a, a, a, a, f, n, n, h, f, n);
};

}  // namespace etude::ops
