// Spec of the AdamW update (PyTorch's formulation, decoupled weight decay), applied by
// optim::adamw::update (config/optim.hpp), which also forms its scalars.
//
//   adamw_update(p, g, m, v, n, const adamw::scalars* sc, const double* grad_scale, const int* skip,
//                working)
//       with g' = g·(*grad_scale), for update number t:
//         p ← p·(1 − lr·wd);  m ← m + (1 − β1)(g' − m);  v ← β2·v + (1 − β2)·g'²;
//         p ← p − (lr / (1 − β1^t))·m / (sqrt(v) / sqrt(1 − β2^t) + eps)
//       the moments rounded to their dtype before they move p (a resumed run reads them back and
//       takes the same step); nothing changes when *skip ≠ 0. With a working copy (mixed
//       precision) the updated weight is also written there, rounded to its dtype.
//
//   adamw_check(p, g, m, v, n, const adamw::scalars* sc, step_decision* d, working)
//       Unless d->skip: computes, with the update's arithmetic and d->grad_scale, every value
//       adamw_update(p, g, m, v, n, sc, &d->grad_scale, &d->skip, working) would store (m and v in
//       their dtype, p in its dtype, the working copy in its dtype) and writes none of them; if
//       one is not finite, refuse_update(*d, update_value_key(i, what)) for the first in
//       (element i, what) order, what being update_value_state0 (m), _state1 (v), _weight,
//       _working (ops/step_control.hpp). Deterministic: the same key on every backend and thread
//       count. `working` (nullable) is only read for its dtype. Runs between step_control and
//       the update, so an update that would overflow from finite gradients is never written.
//
//   Optional forms, where a backend keeps the state in host memory (the CPU's): adamw_update(...,
//   working, optim::update_range* stored) also records the range of what it stored (the largest
//   |p|, |m| and v, the smallest v; unknown if one is not finite), and adamw_check(...,
//   working, const optim::update_range* last) may decide from that range and d->sum_squares alone
//   when they bound every value below the limits, reading no element: it must then decide exactly
//   as the full check would (no refusal). The trainer passes the range only while nothing else has
//   written the weights or states (config/optim.hpp).
// The scalars are formed in double on the host and rounded to the compute type once; *grad_scale
// folds the clip coefficient and the loss scale's inverse (step_control's decision). Every pointer
// argument is memory of the backend that runs the op.
#pragma once

#include "etude/config/optim.hpp"
#include "etude/core/types.hpp"
#include "etude/ops/step_control.hpp"

namespace etude::ops {

template <class B, class Policy>
concept adamw_op = requires(typename Policy::master_t* p, const typename Policy::grad_t* g,
                            typename Policy::state_t* s, typename Policy::param_t* working, index_t n,
                            const optim::adamw::scalars* sc, const double* grad_scale, const int* skip,
                            step_decision* d) {
  B::adamw_update(p, g, s, s, n, sc, grad_scale, skip, working);
  B::adamw_check(static_cast<const typename Policy::master_t*>(p), g, static_cast<const typename Policy::state_t*>(s),
                 static_cast<const typename Policy::state_t*>(s), n, sc, d,
                 static_cast<const typename Policy::param_t*>(working));
};

}  // namespace etude::ops
