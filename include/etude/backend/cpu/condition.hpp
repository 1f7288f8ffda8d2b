// The CPU's condition ops (spec: ops/condition.hpp): table lookups with the null condition, bias
// rows, row masks, fuse::sum's broadcast and its reduction, and fuse::prepend's row placement.
// Reductions run in a fixed order.
#pragma once

#include <cstdint>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_condition {
  template <class A, class W>
  static void condition_gather(A* rows, const W* table, const std::int32_t* index, index_t batch, index_t width,
                               index_t stride) {
    for (index_t b = 0; b < batch; ++b) {
      const std::int32_t i = index[b * stride];
      A* out = rows + b * width;
      for (index_t j = 0; j < width; ++j) out[j] = i >= 0 ? cpu_detail::convert<A>(table[i * width + j]) : A(0.0f);
    }
  }
  template <class G, class A>
  static void condition_gather_bwd(G* dtable, const A* drows, const std::int32_t* index, index_t batch, index_t width,
                                   index_t stride) {
    using Compute = cpu_detail::compute_of<G>;
    for (index_t b = 0; b < batch; ++b) {
      const std::int32_t i = index[b * stride];
      if (i < 0) continue;
      for (index_t j = 0; j < width; ++j)
        dtable[i * width + j] = cpu_detail::convert<G>(cpu_detail::convert<Compute>(dtable[i * width + j]) +
                                                       cpu_detail::convert<Compute>(drows[b * width + j]));
    }
  }
  template <class Y, class W>
  static void bias_rows(Y* y, const W* bias, index_t rows, index_t n, index_t ldy) {
    using Compute = cpu_detail::compute_of<Y>;
#pragma omp parallel for schedule(static) if (rows * n > cpu_detail::parallel_min)
    for (index_t r = 0; r < rows; ++r)
      for (index_t j = 0; j < n; ++j)
        y[r * ldy + j] = cpu_detail::convert<Y>(cpu_detail::convert<Compute>(y[r * ldy + j]) +
                                                cpu_detail::convert<Compute>(bias[j]));
  }
  template <class G, class A>
  static void bias_grad(G* dbias, const A* dy, index_t rows, index_t n, index_t ldy) {
    using Compute = cpu_detail::compute_of<G>;
#pragma omp parallel for schedule(static) if (rows * n > cpu_detail::parallel_min)
    for (index_t j = 0; j < n; ++j) {
      Compute s = cpu_detail::convert<Compute>(dbias[j]);
      for (index_t r = 0; r < rows; ++r) s += cpu_detail::convert<Compute>(dy[r * ldy + j]);
      dbias[j] = cpu_detail::convert<G>(s);
    }
  }
  template <class X, class M>
  static void mask_rows(X* x, const M* mask, index_t rows, index_t n, index_t ldx) {
#pragma omp parallel for schedule(static) if (rows * n > cpu_detail::parallel_min)
    for (index_t r = 0; r < rows; ++r)
      if (mask[r] == M(0))
        for (index_t j = 0; j < n; ++j) x[r * ldx + j] = X(0.0f);
  }
  template <class X, class C>
  static void add_rows(X* x, const C* c, index_t batch, index_t steps, index_t n) {
    using Compute = cpu_detail::compute_of<X>;
#pragma omp parallel for schedule(static) if (batch * steps * n > cpu_detail::parallel_min)
    for (index_t r = 0; r < batch * steps; ++r) {
      const C* cb = c + (r / steps) * n;
      for (index_t j = 0; j < n; ++j)
        x[r * n + j] =
            cpu_detail::convert<X>(cpu_detail::convert<Compute>(x[r * n + j]) + cpu_detail::convert<Compute>(cb[j]));
    }
  }
  template <class C, class X>
  static void sum_rows(C* dc, const X* dx, index_t batch, index_t steps, index_t n) {
    using Compute = cpu_detail::compute_of<C>;
#pragma omp parallel for schedule(static) if (batch * steps * n > cpu_detail::parallel_min)
    for (index_t b = 0; b < batch; ++b)
      for (index_t j = 0; j < n; ++j) {
        Compute s = Compute(0.0);
        for (index_t t = 0; t < steps; ++t) s += cpu_detail::convert<Compute>(dx[(b * steps + t) * n + j]);
        dc[b * n + j] = cpu_detail::convert<C>(s);
      }
  }
  template <class X, class C, class T, class P>
  static void prepend_rows(X* x, const C* cond, const T* tok, const P* pos, index_t batch, index_t lc, index_t steps,
                           index_t n) {
    using Compute = cpu_detail::compute_of<X>;
    const index_t len = lc + steps;
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < batch * len; ++r) {
      const index_t b = r / len, i = r % len;
      X* out = x + r * n;
      if (i < lc) {
        const C* c = cond + (b * lc + i) * n;
        for (index_t j = 0; j < n; ++j)
          out[j] =
              cpu_detail::convert<X>(cpu_detail::convert<Compute>(c[j]) + cpu_detail::convert<Compute>(pos[i * n + j]));
      } else {
        const T* t = tok + (b * steps + i - lc) * n;
        for (index_t j = 0; j < n; ++j) out[j] = cpu_detail::convert<X>(t[j]);
      }
    }
  }
  template <class C, class T, class X>
  static void prepend_rows_bwd(C* dcond, T* dtok, const X* dx, index_t batch, index_t lc, index_t steps, index_t n) {
    const index_t len = lc + steps;
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < batch * len; ++r) {
      const index_t b = r / len, i = r % len;
      const X* in = dx + r * n;
      if (i < lc)
        for (index_t j = 0; j < n; ++j) dcond[(b * lc + i) * n + j] = cpu_detail::convert<C>(in[j]);
      else
        for (index_t j = 0; j < n; ++j) dtok[(b * steps + i - lc) * n + j] = cpu_detail::convert<T>(in[j]);
    }
  }
};

}  // namespace etude::backend
