// Spec of multi-head cross-attention: queries from the token positions, keys and values from the
// condition positions (fuse::cross, config/conditions.hpp).
//
//   cross_attention_scratch(S, L, hd, staged, threads) -> index_t
//       compute-type values of scratch the two ops need for S query rows and L condition positions
//       per sequence (staged: a tensor is stored in 16 bits).
//   cross_attention_fwd<hd>(att (B·S, D), lse (B·S, H), q (B·S, ldq), kv (B·L, 2D), mask (B, L) or
//                           null, B, S, L, H, ldq, scratch, size)
//       att = softmax(q·kᵀ/sqrt(hd) over the valid condition positions)·v per (example, head) (=);
//       kv rows hold k then v, each D = H·hd wide, head h at columns h·hd; mask[b·L + j] = 0 takes
//       position j out of example b's softmax (null: every position takes part, AudioCraft's
//       behaviour). A query row with no valid position has att = 0 and lse = +inf. lse: each score
//       row's log-sum-exp in the compute type, kept for the backward.
//   cross_attention_bwd<hd>(dq (B·S, ldq), dkv (B·L, 2D), datt, q, kv, lse, mask, B, S, L, H, ldq,
//                           scratch, size)
//       dq and dkv = cross-attention'(datt) (=), the probabilities recomputed from q, k and lse.
// mask is in the compute type (1 valid, 0 padding). CPU and CUDA take any head dimension the
// self-attention takes.
#pragma once

#include <concepts>

#include "etude/core/types.hpp"

namespace etude::ops {

template <class B, class Policy>
concept cross_attention_op = requires(typename Policy::activation_t* a, typename Policy::compute_t* f, index_t n,
                                      int h, bool staged) {
  { B::cross_attention_scratch(n, n, n, staged, h) } -> std::convertible_to<index_t>;
  B::template cross_attention_fwd<64>(a, f, a, a, f, n, n, n, h, n, f, n);
  B::template cross_attention_bwd<64>(a, a, a, a, a, f, f, n, n, n, h, n, f, n);
};

}  // namespace etude::ops
