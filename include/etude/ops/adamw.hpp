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
// The scalars are formed in double on the host and rounded to the compute type once; *grad_scale
// folds the clip coefficient and the loss scale's inverse (step_control's decision). Every pointer
// argument is memory of the backend that runs the op.
#pragma once

#include "etude/config/optim.hpp"
#include "etude/core/types.hpp"

namespace etude::ops {

template <class B, class Policy>
concept adamw_op = requires(typename Policy::master_t* p, const typename Policy::grad_t* g,
                            typename Policy::state_t* s, typename Policy::param_t* working, index_t n,
                            const optim::adamw::scalars* sc, const double* grad_scale, const int* skip) {
  B::adamw_update(p, g, s, s, n, sc, grad_scale, skip, working);
};

}  // namespace etude::ops
