// The CPU's SGD update with momentum and its check (spec: ops/sgd.hpp), each one OpenMP SIMD pass
// over the parameters through the same element function, as for AdamW (cpu/adamw.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/config/optim.hpp"
#include "etude/core/types.hpp"
#include "etude/ops/step_control.hpp"

namespace etude::backend {

struct cpu_sgd {
  template <class Compute>
  struct coefficients {
    Compute lr, mu, wd, grad_scale;
    bool nesterov, first_step;
    coefficients(const optim::sgd_scalars& sc, double gs)
        : lr(static_cast<Compute>(sc.lr)), mu(static_cast<Compute>(sc.momentum)),
          wd(static_cast<Compute>(sc.weight_decay)), grad_scale(static_cast<Compute>(gs)), nesterov(sc.nesterov != 0),
          first_step(sc.first != 0) {}
  };
  // What element i's update stores: the buffer in its dtype, the weight in the compute type.
  template <class S, class Compute>
  struct element {
    S buf;
    Compute p;
  };
  template <class M, class G, class S, class Compute>
  static element<S, Compute> step_element(M p0, G g0, S buf0, const coefficients<Compute>& c) {
    const Compute pi = cpu_detail::convert<Compute>(p0);
    const Compute g = cpu_detail::convert<Compute>(g0) * c.grad_scale + c.wd * pi;
    const S bs = cpu_detail::convert<S>(c.first_step ? g : c.mu * cpu_detail::convert<Compute>(buf0) + g);
    const Compute b = cpu_detail::convert<Compute>(bs);
    return {bs, pi - c.lr * (c.nesterov ? g + c.mu * b : b)};
  }

  // SGD with momentum (PyTorch's): g ← g·grad_scale + wd·p; buf ← μ buf + g (buf ← g on the
  // first update); p ← p − lr·(nesterov ? g + μ buf : buf). Scalars and flags as adamw_update;
  // with `stored`, the largest |p| and |buf| it stored go there, as adamw_update records them.
  template <class M, class G, class S, class P = M>
  static void sgd_update(M* p, const G* grad, S* buf, index_t n, const optim::sgd_scalars* sc,
                         const double* grad_scale, const int* skip, P* working = nullptr,
                         optim::update_range* stored = nullptr) {
    if (*skip != 0) return;
    using Compute = cpu_detail::compute_of<M>;
    const coefficients<Compute> c(*sc, *grad_scale);
    if (stored != nullptr) update_loop<true>(p, grad, buf, n, c, working, stored);
    else update_loop<false>(p, grad, buf, n, c, working, stored);
  }
  template <bool Range, class M, class G, class S, class P, class Compute>
  static void update_loop(M* p, const G* grad, S* buf, index_t n, const coefficients<Compute>& c, P* working,
                          optim::update_range* stored) {
    Compute p_max = 0, b_max = 0, zero = 0;
#pragma omp parallel for simd schedule(static) reduction(max : p_max, b_max) reduction(+ : zero)
    for (index_t i = 0; i < n; ++i) {
      const element<S, Compute> e = step_element(p[i], grad[i], buf[i], c);
      buf[i] = e.buf;
      p[i] = cpu_detail::convert<M>(e.p);
      if constexpr (!std::is_same_v<P, M>)
        working[i] = cpu_detail::convert<P>(e.p);
      else if (working != nullptr) working[i] = p[i];
      if constexpr (Range) {
        const Compute ps = cpu_detail::convert<Compute>(p[i]), bs = cpu_detail::convert<Compute>(e.buf);
        zero += ps * Compute(0) + bs * Compute(0);
        p_max = std::max(p_max, std::fabs(ps));
        b_max = std::max(b_max, std::fabs(bs));
      }
    }
    if constexpr (Range) *stored = {n > 0 && zero == Compute(0), p_max, {b_max, 0.0}, 0.0};
  }

  // Whether `last` and the gradients' sum of squares bound every value this update would store
  // below the check's limits (as cpu_adamw::within_range): |g| ≤ sqrt(Σ g²)·grad_scale + wd·|p|;
  // |buf'| ≤ μ·|buf| + |g| (|g| on the first update); |p'| ≤ |p| + lr·(|g| + μ·|buf'|) with
  // Nesterov, |p| + lr·|buf'| without. Conservative only.
  template <class S, class Compute>
  static bool within_range(const optim::update_range& last, const coefficients<Compute>& c, double sum_squares,
                           double weight_limit) {
    constexpr double margin = 1.01;
    constexpr double compute_limit = cpu_detail::update_limit<Compute>;
    constexpr double state_limit = std::min(compute_limit, cpu_detail::update_limit<S>);
    if (!last.known) return false;
    const double lr = std::fabs(static_cast<double>(c.lr)), mu = std::fabs(static_cast<double>(c.mu));
    const double g = (std::sqrt(sum_squares) * std::fabs(static_cast<double>(c.grad_scale)) +
                      std::fabs(static_cast<double>(c.wd)) * last.weight) * margin;
    const double b_next = ((c.first_step ? 0.0 : mu * last.state_max[0]) + g) * margin;
    const double p_next = (last.weight + lr * (c.nesterov ? g + mu * b_next : b_next)) * margin;
    return g < compute_limit && b_next < state_limit && p_next < weight_limit;
  }

  // The check of the update above (ops/sgd.hpp): nothing written, the first non-finite stored
  // value refusing the update; with a known `last` that bounds every value below the limits
  // (within_range), nothing read.
  template <class M, class G, class S, class P = M>
  static void sgd_check(const M* p, const G* grad, const S* buf, index_t n, const optim::sgd_scalars* sc,
                        step_decision* d, const P* working = nullptr, const optim::update_range* last = nullptr) {
    if (d->skip != 0) return;
    using Compute = cpu_detail::compute_of<M>;
    const coefficients<Compute> c(*sc, d->grad_scale);
    const bool check_working = working != nullptr && !std::is_same_v<P, M>;
    const double weight_limit = cpu_detail::weight_update_limit<M, P>(check_working);
    if (last != nullptr && within_range<S>(*last, c, d->sum_squares, weight_limit)) return;
    // first whether there is one: each stored value times 0 is 0 when finite and NaN when not, so
    // a sum in any order says it, in one vectorised reduction; then, only if so, which is first
    Compute zero = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : zero)
    for (index_t i = 0; i < n; ++i) {
      const element<S, Compute> e = step_element(p[i], grad[i], buf[i], c);
      zero += cpu_detail::convert<Compute>(e.buf) * Compute(0) +
              cpu_detail::convert<Compute>(cpu_detail::convert<M>(e.p)) * Compute(0) +
              (check_working ? cpu_detail::convert<Compute>(cpu_detail::convert<P>(e.p)) * Compute(0) : Compute(0));
    }
    if (zero == Compute(0)) return;
    constexpr index_t none = std::numeric_limits<index_t>::max();
    index_t first = none;
#pragma omp parallel for schedule(static) reduction(min : first)
    for (index_t i = 0; i < n; ++i) {
      const element<S, Compute> e = step_element(p[i], grad[i], buf[i], c);
      const int what = !cpu_detail::finite(e.buf)                                          ? update_value_state0
                       : !cpu_detail::finite(cpu_detail::convert<M>(e.p))                  ? update_value_weight
                       : check_working && !cpu_detail::finite(cpu_detail::convert<P>(e.p)) ? update_value_working
                                                                                           : -1;
      if (what >= 0) first = std::min(first, update_value_key(i, what));
    }
    if (first != none) refuse_update(*d, first);
  }
};

}  // namespace etude::backend
