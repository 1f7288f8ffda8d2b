// Spec of the input embedding: K codebook tables summed, plus sinusoidal positions.
//
//   sinusoid(out (S, D), S, D)
//       AudioCraft's positions: out(s, j) = cos(s / 10000^(j / (D/2 − 1))) for j < D/2, sin of the
//       same phase for the second half; computed in double, rounded once.
//   embedding_fwd(x (B·S, D), seq (B, K, S), tables[K] (C+1, D), pos (S, D), B, K, S, D)
//       x(b·S + s) = Σ_k table_k(seq(b, k, s)) + pos(s), summed in codebook order, rounded once (=).
//   embedding_bwd(dtables[K], dx (B·S, D), seq, B, K, S, D)
//       dtable_k(seq(b, k, s)) += dx(b·S + s), deterministic (positions in order, no atomics).
// tables and dtables are host arrays of K pointers into the backend's memory.
#pragma once

#include <concepts>

#include "etude/core/types.hpp"

namespace etude::ops {

template <class B, class Policy>
concept embedding_op = requires(typename Policy::activation_t* a, typename Policy::compute_t* f,
                                const typename Policy::param_t* const* tables, typename Policy::grad_t* const* dtables,
                                const token_t* tok, index_t n, int k) {
  B::sinusoid(f, n, n);
  B::embedding_fwd(a, tok, tables, f, n, k, n, n);
  B::embedding_bwd(dtables, a, tok, n, k, n, n);
};

}  // namespace etude::ops
