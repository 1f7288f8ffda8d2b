// Spec of the SGD update with momentum (PyTorch's torch.optim.SGD), applied by optim::sgd::update
// (config/optim.hpp), which also forms its scalars.
//
//   sgd_update(p, g, buf, n, const sgd_scalars* sc, const double* grad_scale, const int* skip,
//              working)
//       g' = g·(*grad_scale) + wd·p;  buf ← g' on the first update, else μ·buf + g' (rounded to
//       its dtype before use);  p ← p − lr·(nesterov ? g' + μ·buf : buf).
//       Nothing changes when *skip ≠ 0; a working copy (mixed precision) receives the rounded p.
//
//   sgd_check(p, g, buf, n, const sgd_scalars* sc, step_decision* d, working)
//       as adamw_check (ops/adamw.hpp): unless d->skip, the values sgd_update would store (buf,
//       then p, then the working copy: update_value_state0, _weight, _working) are computed and
//       not written; the first non-finite one refuses the update.
//
//   Optional forms, as adamw's: sgd_update(..., working, optim::update_range* stored) records the
//   largest |p| and |buf| it stored (buf as state 0), and sgd_check(...,
//   working, const optim::update_range* last) may decide from that range alone.
// Scalars, grad_scale and skip as in ops/adamw.hpp.
#pragma once

#include "etude/config/optim.hpp"
#include "etude/core/types.hpp"
#include "etude/ops/step_control.hpp"

namespace etude::ops {

template <class B, class Policy>
concept sgd_op = requires(typename Policy::master_t* p, const typename Policy::grad_t* g,
                          typename Policy::state_t* s, typename Policy::param_t* working, index_t n,
                          const optim::sgd_scalars* sc, const double* grad_scale, const int* skip, step_decision* d) {
  B::sgd_update(p, g, s, n, sc, grad_scale, skip, working);
  B::sgd_check(static_cast<const typename Policy::master_t*>(p), g, static_cast<const typename Policy::state_t*>(s), n,
               sc, d, static_cast<const typename Policy::param_t*>(working));
};

}  // namespace etude::ops
