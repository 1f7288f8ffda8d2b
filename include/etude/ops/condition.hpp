// Spec of the small ops that turn conditions into the condition tensor and back
// (config/conditions.hpp; model/transformer.hpp's condition encoder).
//
//   condition_gather(rows (B, W), table (V, W), index (B), stride)
//       rows[b] = table[index[b·stride]] (=); index −1 (the null condition) gives a zero row.
//   condition_gather_bwd(dtable (V, W), drows (B, W), index (B), stride)
//       dtable[index[b·stride]] += drows[b] for every b with index >= 0, in order of b.
//   bias_rows(y (R, N), bias (N), ldy)              y[r] += bias (=: in place)
//   bias_grad(dbias (N), dy (R, N), ldy)            dbias += Σ_r dy[r]
//   mask_rows(x (R, N), mask (R), ldx)              x[r] *= mask[r] (in place; mask 0 or 1)
//   add_rows(x (B·S, N), c (B, N), S)               x[b·S + s] += c[b]: fuse::sum's broadcast
//   sum_rows(dc (B, N), dx (B·S, N), S)             dc[b] = Σ_s dx[b·S + s] (=)
//   prepend_rows(x (B·(LC+S), N), cond (B·LC, N), tok (B·S, N), pos (LC, N), B, LC, S, N)
//       fuse::prepend's sequence (=): x[b·(LC+S) + i] = cond[b·LC + i] + pos(i) for i < LC, added in
//       the compute type and rounded once; x[b·(LC+S) + LC + s] = tok[b·S + s] (a copy: the token
//       rows arrive with their positions LC + s already added by embedding_fwd).
//   prepend_rows_bwd(dcond (B·LC, N), dtok (B·S, N), dx (B·(LC+S), N), B, LC, S, N)
//       its backward (=, both): dcond[b·LC + i] = dx[b·(LC+S) + i], dtok[b·S + s] =
//       dx[b·(LC+S) + LC + s]; the prepended rows reach no embedding table (embedding_bwd reads dtok).
// index is int32 in the backend's memory; mask in the compute type.
#pragma once

#include <concepts>
#include <cstdint>

#include "etude/core/types.hpp"

namespace etude::ops {

template <class B, class Policy>
concept condition_op = requires(typename Policy::activation_t* a, typename Policy::param_t* w,
                                typename Policy::grad_t* g, typename Policy::compute_t* f, const std::int32_t* idx,
                                index_t n) {
  B::condition_gather(a, w, idx, n, n, n);
  B::condition_gather_bwd(g, a, idx, n, n, n);
  B::bias_rows(a, w, n, n, n);
  B::bias_grad(g, a, n, n, n);
  B::mask_rows(a, f, n, n, n);
  B::add_rows(a, a, n, n, n);
  B::sum_rows(a, a, n, n, n);
  B::prepend_rows(a, a, a, f, n, n, n, n);
  B::prepend_rows_bwd(a, a, a, n, n, n, n);
};

}  // namespace etude::ops
