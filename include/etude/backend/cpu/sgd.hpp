// The CPU's SGD update with momentum (spec: ops/sgd.hpp), one OpenMP SIMD pass over the parameters.
#pragma once

#include <cmath>
#include <type_traits>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/config/optim.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_sgd {
  // SGD with momentum (PyTorch's): g ← g·grad_scale + wd·p; buf ← μ buf + g (buf ← g on the
  // first update); p ← p − lr·(nesterov ? g + μ buf : buf). Scalars and flags as adamw_update.
  template <class M, class G, class S, class P = M>
  static void sgd_update(M* p, const G* grad, S* buf, index_t n, const optim::sgd_scalars* sc,
                         const double* grad_scale, const int* skip, P* working = nullptr) {
    if (*skip != 0) return;
    using F = cpu_detail::compute_of<M>;
    const auto l = static_cast<F>(sc->lr), mu = static_cast<F>(sc->momentum), wd = static_cast<F>(sc->weight_decay),
               gs = static_cast<F>(*grad_scale);
    const bool nesterov = sc->nesterov != 0, first_step = sc->first != 0;
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) {
      const F pi = cpu_detail::cv<F>(p[i]);
      const F g = cpu_detail::cv<F>(grad[i]) * gs + wd * pi;
      const F b = cpu_detail::cv<F>(cpu_detail::cv<S>(first_step ? g : mu * cpu_detail::cv<F>(buf[i]) + g));
      buf[i] = cpu_detail::cv<S>(b);
      const F next = pi - l * (nesterov ? g + mu * b : b);
      p[i] = cpu_detail::cv<M>(next);
      if constexpr (!std::is_same_v<P, M>) working[i] = cpu_detail::cv<P>(next);
      else if (working != nullptr) working[i] = p[i];
    }
  }
};

}  // namespace etude::backend
