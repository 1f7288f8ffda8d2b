// The CPU's AdamW update (spec: ops/adamw.hpp), one OpenMP SIMD pass over the parameters.
#pragma once

#include <cmath>
#include <type_traits>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/config/optim.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_adamw {
  // AdamW (PyTorch's formulation) on g = grad·grad_scale at update number t (from 1):
  // p ← p(1 − lr·wd); m ← m + (1−β1)(g − m); v ← β2 v + (1−β2) g²;
  // p ← p − (lr/(1−β1^t))·m / (sqrt(v)/sqrt(1−β2^t) + eps). The scalars (optim::adamw::scalars)
  // are formed in double on the host and rounded to the compute type here, once. *grad_scale folds
  // the clip coefficient and the loss scale's inverse into one factor; nothing changes when *skip.
  // With a working copy (mixed precision), the updated master weight is also written there, rounded.
  template <class M, class G, class S, class P = M>
  static void adamw_update(M* p, const G* grad, S* m, S* v, index_t n, const optim::adamw::scalars* sc,
                           const double* grad_scale, const int* skip, P* working = nullptr) {
    if (*skip != 0) return;
    using F = cpu_detail::compute_of<M>;
    const auto step_size = static_cast<F>(sc->step_size), bc2_sqrt = static_cast<F>(sc->bc2_sqrt),
               decay = static_cast<F>(sc->decay), w1 = static_cast<F>(sc->w1), b2 = static_cast<F>(sc->b2),
               w2 = static_cast<F>(sc->w2), e = static_cast<F>(sc->eps), gs = static_cast<F>(*grad_scale);
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) {
      const F g = cpu_detail::cv<F>(grad[i]) * gs;
      F pi = cpu_detail::cv<F>(p[i]) * decay;
      const F mi = cpu_detail::cv<F>(m[i]) + w1 * (g - cpu_detail::cv<F>(m[i]));
      const F vi = cpu_detail::cv<F>(v[i]) * b2 + w2 * g * g;
      // the moments are rounded to their storage type before they move the weight, so a
      // resumed run (which reads them back) takes exactly the same step
      const F ms = cpu_detail::cv<F>(cpu_detail::cv<S>(mi)), vs = cpu_detail::cv<F>(cpu_detail::cv<S>(vi));
      m[i] = cpu_detail::cv<S>(mi);
      v[i] = cpu_detail::cv<S>(vi);
      pi -= step_size * ms / (std::sqrt(vs) / bc2_sqrt + e);
      p[i] = cpu_detail::cv<M>(pi);
      if constexpr (!std::is_same_v<P, M>) working[i] = cpu_detail::cv<P>(pi);
      else if (working != nullptr) working[i] = p[i];
    }
  }
};

}  // namespace etude::backend
