// The CPU's AdamW update and its check (spec: ops/adamw.hpp), each one OpenMP SIMD pass over the
// parameters through the same element function, so the check sees exactly the values the update
// would store.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/config/optim.hpp"
#include "etude/core/types.hpp"
#include "etude/ops/step_control.hpp"

namespace etude::backend {

struct cpu_adamw {
  // optim::adamw::scalars and the gradient factor rounded to the compute type once.
  template <class Compute>
  struct coefficients {
    Compute step_size, bc2_sqrt, decay, w1, b2, w2, eps, grad_scale;
    coefficients(const optim::adamw::scalars& sc, double gs)
        : step_size(static_cast<Compute>(sc.step_size)), bc2_sqrt(static_cast<Compute>(sc.bc2_sqrt)),
          decay(static_cast<Compute>(sc.decay)), w1(static_cast<Compute>(sc.w1)), b2(static_cast<Compute>(sc.b2)),
          w2(static_cast<Compute>(sc.w2)), eps(static_cast<Compute>(sc.eps)), grad_scale(static_cast<Compute>(gs)) {}
  };

  // What element i's update stores: the moments in their dtype and the weight in the compute type
  // (rounded to each weight copy's dtype by the caller).
  template <class S, class Compute>
  struct element {
    S m, v;
    Compute p;
  };
  // The step in two halves, so that the update can take the square roots of a run of elements
  // at once between them (vmath's sqrt_in_place); step_element joins them for one element.
  template <class M, class G, class S, class Compute>
  static element<S, Compute> moments(M p0, G g0, S m0, S v0, const coefficients<Compute>& c) {
    const Compute g = cpu_detail::convert<Compute>(g0) * c.grad_scale;
    const Compute mi = cpu_detail::convert<Compute>(m0) + c.w1 * (g - cpu_detail::convert<Compute>(m0));
    const Compute vi = cpu_detail::convert<Compute>(v0) * c.b2 + c.w2 * g * g;
    // the moments are rounded to their storage type before they move the weight, so a
    // resumed run (which reads them back) takes exactly the same step
    return {cpu_detail::convert<S>(mi), cpu_detail::convert<S>(vi), cpu_detail::convert<Compute>(p0) * c.decay};
  }
  // the decayed weight e.p moved by the first moment over root = sqrt(v)
  template <class S, class Compute>
  static Compute moved(const element<S, Compute>& e, Compute root, const coefficients<Compute>& c) {
    return e.p - c.step_size * cpu_detail::convert<Compute>(e.m) / (root / c.bc2_sqrt + c.eps);
  }
  template <class M, class G, class S, class Compute>
  static element<S, Compute> step_element(M p0, G g0, S m0, S v0, const coefficients<Compute>& c) {
    element<S, Compute> e = moments(p0, g0, m0, v0, c);
    e.p = moved(e, std::sqrt(cpu_detail::convert<Compute>(e.v)), c);
    return e;
  }

  // AdamW (PyTorch's formulation) on g = grad·grad_scale at update number t (from 1):
  // p ← p(1 − lr·wd); m ← m + (1−β1)(g − m); v ← β2 v + (1−β2) g²;
  // p ← p − (lr/(1−β1^t))·m / (sqrt(v)/sqrt(1−β2^t) + eps). The scalars (optim::adamw::scalars)
  // are formed in double on the host and rounded to the compute type here, once. *grad_scale folds
  // the clip coefficient and the loss scale's inverse into one factor; nothing changes when *skip.
  // With a working copy (mixed precision), the updated master weight is also written there, rounded.
  // With `stored`, the largest |p|, |m| and v and the smallest v it stored go there (for the next
  // check; taken in the same pass, from values in registers).
  template <class M, class G, class S, class P = M>
  static void adamw_update(M* p, const G* grad, S* m, S* v, index_t n, const optim::adamw::scalars* sc,
                           const double* grad_scale, const int* skip, P* working = nullptr,
                           optim::update_range* stored = nullptr) {
    if (*skip != 0) return;
    using Compute = cpu_detail::compute_of<M>;
    const coefficients<Compute> c(*sc, *grad_scale);
    // what is written is decided outside the loop: a test inside keeps it scalar
    if (working != nullptr) {
      if (stored != nullptr) update_loop<true, true>(p, grad, m, v, n, c, working, stored);
      else update_loop<true, false>(p, grad, m, v, n, c, working, stored);
    } else {
      if (stored != nullptr) update_loop<false, true>(p, grad, m, v, n, c, working, stored);
      else update_loop<false, false>(p, grad, m, v, n, c, working, stored);
    }
  }

  // step_element over runs of `run` elements: the moments (stored) and the decayed weights, the
  // square roots of the run in one call, then the weights. The same operations in the same order,
  // so the same bits.
  template <bool Working, bool Range, class M, class G, class S, class P, class Compute>
  static void update_loop(M* p, const G* grad, S* m, S* v, index_t n, const coefficients<Compute>& c, P* working,
                          optim::update_range* stored) {
    constexpr index_t run = 1024;
    // the range, and `zero`: each stored value times 0, which is 0 unless one is not finite (the
    // check passed, so none is; an update run without it leaves the range unknown if one is not)
    Compute p_max = 0, m_max = 0, v_max = 0, v_min = std::numeric_limits<Compute>::infinity(), zero = 0;
#pragma omp parallel for schedule(static) reduction(max : p_max, m_max, v_max) reduction(min : v_min) \
    reduction(+ : zero)
    for (index_t r0 = 0; r0 < n; r0 += run) {
      const index_t len = std::min(run, n - r0);
      Compute root[run], decayed[run];
#pragma omp simd
      for (index_t j = 0; j < len; ++j) {
        const index_t i = r0 + j;
        const element<S, Compute> e = moments(p[i], grad[i], m[i], v[i], c);
        m[i] = e.m;
        v[i] = e.v;
        decayed[j] = e.p;
        root[j] = cpu_detail::convert<Compute>(e.v);
      }
      cpu_detail::sqrt_in_place(root, len);
#pragma omp simd reduction(max : p_max, m_max, v_max) reduction(min : v_min) reduction(+ : zero)
      for (index_t j = 0; j < len; ++j) {
        const index_t i = r0 + j;
        const Compute pi = moved(element<S, Compute>{m[i], v[i], decayed[j]}, root[j], c);
        p[i] = cpu_detail::convert<M>(pi);
        if constexpr (Working) working[i] = cpu_detail::convert<P>(pi);
        if constexpr (Range) {
          const Compute ms = cpu_detail::convert<Compute>(m[i]), vs = cpu_detail::convert<Compute>(v[i]);
          const Compute ps = cpu_detail::convert<Compute>(cpu_detail::convert<M>(pi));
          zero += ps * Compute(0) + ms * Compute(0) + vs * Compute(0);
          p_max = std::max(p_max, std::fabs(ps));
          m_max = std::max(m_max, std::fabs(ms));
          v_max = std::max(v_max, std::fabs(vs));
          v_min = std::min(v_min, vs);
        }
      }
    }
    if constexpr (Range) *stored = {n > 0 && zero == Compute(0), p_max, {m_max, v_max}, n > 0 ? v_min : Compute(0)};
  }

  // Whether `last` (what the previous update stored, all finite) and the gradients' sum of squares
  // bound every value this update would store below the check's limits, in double with a margin
  // for the compute type's rounding: |g| ≤ sqrt(Σ g²)·grad_scale (Σ g² of the stored gradients in
  // double, so at least the largest square); |m'| ≤ |m| + w1(|g| + |m|); 0 ≤ v' ≤ β2·v + w2·g²;
  // |p'| ≤ |p·decay| + step_size·|m'|/eps (the denominator is at least eps). Conservative only:
  // false sends the check to its passes over the elements, which decide.
  template <class S, class Compute>
  static bool within_range(const optim::update_range& last, const coefficients<Compute>& c, double sum_squares,
                           double weight_limit) {
    constexpr double margin = 1.01;  // float rounding of the few operations per value moves them by ulps
    constexpr double compute_limit = cpu_detail::update_limit<Compute>;
    constexpr double state_limit = std::min(compute_limit, cpu_detail::update_limit<S>);
    const double w1 = c.w1, b2 = c.b2, w2 = c.w2, eps = c.eps, decay = c.decay, step_size = c.step_size;
    if (!last.known || !(w1 >= 0.0 && b2 >= 0.0 && w2 >= 0.0 && eps > 0.0 && c.bc2_sqrt > Compute(0)) ||
        !(last.second_min >= 0.0))
      return false;
    const double g = std::sqrt(sum_squares) * std::fabs(static_cast<double>(c.grad_scale)) * margin;
    const double m = last.state_max[0], v = last.state_max[1];
    const double m_next = (m + w1 * (g + m)) * margin;
    const double v_next = (b2 * v + w2 * g * g) * margin;
    const double p_next = (last.weight * std::fabs(decay) + std::fabs(step_size) * m_next / eps) * margin;
    return g < compute_limit && g * g < compute_limit && m_next < state_limit && v_next < state_limit &&
           p_next < weight_limit;
  }

  // The check of the update above (ops/adamw.hpp): the same elements, nothing written, the first
  // non-finite stored value refusing the update. A first pass screens without the square root and
  // the division (the cost of the update): the moments exactly (each times 0 is 0 when finite, NaN
  // when not, so a sum in any order says it), the weight by |p·decay| + |step_size·m|/eps, a bound
  // of |p'| (the denominator is at least eps) that must stay below half the dtype's largest value
  // (float rounding moves it by a few ulp).
  // Only when something fails the screen does the exact pass run, which decides. With a known
  // `last` (the previous update's range, nothing written since) that bounds every value below the
  // limits (within_range), neither pass runs: the step reads no element twice.
  template <class M, class G, class S, class P = M>
  static void adamw_check(const M* p, const G* grad, const S* m, const S* v, index_t n,
                          const optim::adamw::scalars* sc, step_decision* d, const P* working = nullptr,
                          const optim::update_range* last = nullptr) {
    if (d->skip != 0) return;
    using Compute = cpu_detail::compute_of<M>;
    const coefficients<Compute> c(*sc, d->grad_scale);
    // a working copy of another dtype can overflow where the master does not (fp16 above 65504)
    const bool check_working = working != nullptr && !std::is_same_v<P, M>;
    const double weight_limit = cpu_detail::weight_update_limit<M, P>(check_working);
    if (last != nullptr && within_range<S>(*last, c, d->sum_squares, weight_limit)) return;
    const Compute limit = static_cast<Compute>(weight_limit);
    const Compute inv_eps = Compute(1) / c.eps;
    Compute zero = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : zero)
    for (index_t i = 0; i < n; ++i) {
      const Compute g = cpu_detail::convert<Compute>(grad[i]) * c.grad_scale;
      const Compute m0 = cpu_detail::convert<Compute>(m[i]);
      const Compute ms = cpu_detail::convert<Compute>(cpu_detail::convert<S>(m0 + c.w1 * (g - m0)));
      const Compute vs = cpu_detail::convert<Compute>(
          cpu_detail::convert<S>(cpu_detail::convert<Compute>(v[i]) * c.b2 + c.w2 * g * g));
      const Compute bound =
          std::fabs(cpu_detail::convert<Compute>(p[i]) * c.decay) + std::fabs(c.step_size * ms) * inv_eps;
      // a negative second moment (restored corrupt state) would make the square root NaN
      zero += ms * Compute(0) + vs * Compute(0) + (bound < limit && vs >= Compute(0) ? Compute(0) : Compute(1));
    }
    if (zero == Compute(0)) return;
    constexpr index_t none = std::numeric_limits<index_t>::max();
    index_t first = none;
#pragma omp parallel for schedule(static) reduction(min : first)
    for (index_t i = 0; i < n; ++i) {
      const element<S, Compute> e = step_element(p[i], grad[i], m[i], v[i], c);
      const int what = !cpu_detail::finite(e.m)                                            ? update_value_state0
                       : !cpu_detail::finite(e.v)                                          ? update_value_state1
                       : !cpu_detail::finite(cpu_detail::convert<M>(e.p))                  ? update_value_weight
                       : check_working && !cpu_detail::finite(cpu_detail::convert<P>(e.p)) ? update_value_working
                                                                                           : -1;
      if (what >= 0) first = std::min(first, update_value_key(i, what));
    }
    if (first != none) refuse_update(*d, first);
  }
};

}  // namespace etude::backend
