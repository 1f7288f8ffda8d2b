// The CUDA backend's condition ops (spec: ops/condition.hpp) on the current stream: table lookups
// with the null condition (index −1: a zero row), bias rows, row masks, fuse::sum's broadcast
// and its reduction, and fuse::prepend's row placement (elementwise, so bit-identical too). Elementwise ones are grid-stride loops; every reduction is one thread per
// output element walking its terms in the CPU backend's order, with no atomics:
//   condition_gather_bwd: a thread per table column walks the examples in order (rounded after
//                         every add, as the CPU does for 16-bit gradients);
//   bias_grad:            a thread per column adds the rows in order onto dbias, rounded once;
//   sum_rows:             a thread per (example, column) adds the steps in order from zero.
// In float the results are bit-identical to the CPU's. index: int32 in device memory; mask: the
// compute type (float) in device memory.
// Not for: the condition inputs' layout (train/detail/trainer_inputs.hpp) or cross-attention
// (cross_attention.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "etude/backend/cuda/check.cuh"
#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"

namespace etude::cuda {

namespace detail::cond {

template <class A, class W>
__global__ void gather(A* rows, const W* table, const std::int32_t* index, index_t batch, index_t width,
                       index_t stride) {
  grid_stride<1>(batch * width, [&](index_t e) {
    const index_t b = e / width, j = e % width;
    const std::int32_t i = index[b * stride];
    rows[e] = i >= 0 ? from_float<A>(to_float(table[static_cast<index_t>(i) * width + j])) : from_float<A>(0.0f);
  });
}

template <class G, class A>
__global__ void gather_bwd(G* dtable, const A* drows, const std::int32_t* index, index_t batch, index_t width,
                           index_t stride) {
  grid_stride<1>(width, [&](index_t j) {
    for (index_t b = 0; b < batch; ++b) {
      const std::int32_t i = index[b * stride];
      if (i < 0) continue;
      G* out = dtable + static_cast<index_t>(i) * width + j;
      *out = from_float<G>(to_float(*out) + to_float(drows[b * width + j]));
    }
  });
}

template <class Y, class W>
__global__ void bias_rows(Y* y, const W* bias, index_t rows, index_t n, index_t ldy) {
  grid_stride<1>(rows * n, [&](index_t e) {
    const index_t r = e / n, j = e % n;
    Y* p = y + r * ldy + j;
    *p = from_float<Y>(to_float(*p) + to_float(bias[j]));
  });
}

template <class G, class A>
__global__ void bias_grad(G* dbias, const A* dy, index_t rows, index_t n, index_t ldy) {
  grid_stride<1>(n, [&](index_t j) {
    float s = to_float(dbias[j]);
    for (index_t r = 0; r < rows; ++r) s += to_float(dy[r * ldy + j]);
    dbias[j] = from_float<G>(s);
  });
}

template <class X, class M>
__global__ void mask_rows(X* x, const M* mask, index_t rows, index_t n, index_t ldx) {
  grid_stride<1>(rows * n, [&](index_t e) {
    const index_t r = e / n, j = e % n;
    if (to_float(mask[r]) == 0.0f) x[r * ldx + j] = from_float<X>(0.0f);
  });
}

template <class X, class C>
__global__ void add_rows(X* x, const C* c, index_t steps, index_t n, index_t total) {
  grid_stride<1>(total, [&](index_t e) {
    const index_t r = e / n, j = e % n;
    x[e] = from_float<X>(to_float(x[e]) + to_float(c[(r / steps) * n + j]));
  });
}

template <class C, class X>
__global__ void sum_rows(C* dc, const X* dx, index_t batch, index_t steps, index_t n) {
  grid_stride<1>(batch * n, [&](index_t e) {
    const index_t b = e / n, j = e % n;
    float s = 0.0f;
    for (index_t t = 0; t < steps; ++t) s += to_float(dx[(b * steps + t) * n + j]);
    dc[e] = from_float<C>(s);
  });
}

template <class X, class C, class T, class P>
__global__ void prepend_rows(X* x, const C* cond, const T* tok, const P* pos, index_t lc, index_t steps, index_t n,
                             index_t total) {
  grid_stride<1>(total, [&](index_t e) {
    const index_t len = lc + steps, r = e / n, j = e % n, b = r / len, i = r % len;
    x[e] = i < lc ? from_float<X>(to_float(cond[(b * lc + i) * n + j]) + to_float(pos[i * n + j]))
                  : from_float<X>(to_float(tok[(b * steps + i - lc) * n + j]));
  });
}

template <class C, class T, class X>
__global__ void prepend_rows_bwd(C* dcond, T* dtok, const X* dx, index_t lc, index_t steps, index_t n,
                                 index_t total) {
  grid_stride<1>(total, [&](index_t e) {
    const index_t len = lc + steps, r = e / n, j = e % n, b = r / len, i = r % len;
    if (i < lc) dcond[(b * lc + i) * n + j] = from_float<C>(to_float(dx[e]));
    else dtok[(b * steps + i - lc) * n + j] = from_float<T>(to_float(dx[e]));
  });
}

// Blocks for `n` threads' worth of work (a grid-stride loop covers the rest).
template <class T>
inline unsigned grid(index_t n) {
  using tune = tuning<op::condition, T>;
  return grid_for(n, tune::threads, tune::blocks_per_sm);
}

}  // namespace detail::cond

// The condition ops (ops/condition.hpp); backend::cuda inherits them.
struct cuda_condition {
  // rows (B, W) = table[index[b·stride]] (=), a zero row where the index is −1.
  template <class A, class W>
  static void condition_gather(A* rows, const W* table, const std::int32_t* index, index_t batch, index_t width,
                               index_t stride) {
    if (batch <= 0 || width <= 0) return;
    using tune = tuning<op::condition, A>;
    ETUDE_LAUNCH(detail::cond::gather, detail::cond::grid<A>(batch * width), tune::threads, 0, current().stream())
        (dev(rows), dev(table), index, batch, width, stride);
    ETUDE_CUDA_CHECK_LAUNCH("condition gather");
  }

  // dtable[index[b·stride]] += drows[b] for every b with index >= 0, in order of b.
  template <class G, class A>
  static void condition_gather_bwd(G* dtable, const A* drows, const std::int32_t* index, index_t batch, index_t width,
                                   index_t stride) {
    if (batch <= 0 || width <= 0) return;
    using tune = tuning<op::condition, G>;
    ETUDE_LAUNCH(detail::cond::gather_bwd, detail::cond::grid<G>(width), tune::threads, 0, current().stream())
        (dev(dtable), dev(drows), index, batch, width, stride);
    ETUDE_CUDA_CHECK_LAUNCH("condition gather backward");
  }

  // y[r] += bias (in place), rows with leading dimension ldy.
  template <class Y, class W>
  static void bias_rows(Y* y, const W* bias, index_t rows, index_t n, index_t ldy) {
    if (rows <= 0 || n <= 0) return;
    using tune = tuning<op::condition, Y>;
    ETUDE_LAUNCH(detail::cond::bias_rows, detail::cond::grid<Y>(rows * n), tune::threads, 0, current().stream())
        (dev(y), dev(bias), rows, n, ldy);
    ETUDE_CUDA_CHECK_LAUNCH("bias_rows");
  }

  // dbias += Σ_r dy[r], rows in order.
  template <class G, class A>
  static void bias_grad(G* dbias, const A* dy, index_t rows, index_t n, index_t ldy) {
    if (rows <= 0 || n <= 0) return;
    using tune = tuning<op::condition, G>;
    ETUDE_LAUNCH(detail::cond::bias_grad, detail::cond::grid<G>(n), tune::threads, 0, current().stream())
        (dev(dbias), dev(dy), rows, n, ldy);
    ETUDE_CUDA_CHECK_LAUNCH("bias_grad");
  }

  // x[r] = 0 where mask[r] is 0 (in place).
  template <class X, class M>
  static void mask_rows(X* x, const M* mask, index_t rows, index_t n, index_t ldx) {
    if (rows <= 0 || n <= 0) return;
    using tune = tuning<op::condition, X>;
    ETUDE_LAUNCH(detail::cond::mask_rows, detail::cond::grid<X>(rows * n), tune::threads, 0, current().stream())
        (dev(x), dev(mask), rows, n, ldx);
    ETUDE_CUDA_CHECK_LAUNCH("mask_rows");
  }

  // x[b·S + s] += c[b] (x (B·S, N), c (B, N)).
  template <class X, class C>
  static void add_rows(X* x, const C* c, index_t batch, index_t steps, index_t n) {
    const index_t total = batch * steps * n;
    if (total <= 0) return;
    using tune = tuning<op::condition, X>;
    ETUDE_LAUNCH(detail::cond::add_rows, detail::cond::grid<X>(total), tune::threads, 0, current().stream())
        (dev(x), dev(c), steps, n, total);
    ETUDE_CUDA_CHECK_LAUNCH("add_rows");
  }

  // dc[b] = Σ_s dx[b·S + s] (=), steps in order.
  template <class C, class X>
  static void sum_rows(C* dc, const X* dx, index_t batch, index_t steps, index_t n) {
    if (batch <= 0 || n <= 0) return;
    using tune = tuning<op::condition, C>;
    ETUDE_LAUNCH(detail::cond::sum_rows, detail::cond::grid<C>(batch * n), tune::threads, 0, current().stream())
        (dev(dc), dev(dx), batch, steps, n);
    ETUDE_CUDA_CHECK_LAUNCH("sum_rows");
  }

  // fuse::prepend's sequence: x[b·(LC+S) + i] = cond[b·LC + i] + pos(i) for i < LC, then the token
  // rows tok[b·S + s] copied after them.
  template <class X, class C, class T, class P>
  static void prepend_rows(X* x, const C* cond, const T* tok, const P* pos, index_t batch, index_t lc, index_t steps,
                           index_t n) {
    const index_t total = batch * (lc + steps) * n;
    if (total <= 0) return;
    using tune = tuning<op::condition, X>;
    ETUDE_LAUNCH(detail::cond::prepend_rows, detail::cond::grid<X>(total), tune::threads, 0, current().stream())
        (dev(x), dev(cond), dev(tok), dev(pos), lc, steps, n, total);
    ETUDE_CUDA_CHECK_LAUNCH("prepend_rows");
  }

  // Its backward: the prepended rows' gradient to dcond, the token rows' to dtok (both =).
  template <class C, class T, class X>
  static void prepend_rows_bwd(C* dcond, T* dtok, const X* dx, index_t batch, index_t lc, index_t steps, index_t n) {
    const index_t total = batch * (lc + steps) * n;
    if (total <= 0) return;
    using tune = tuning<op::condition, X>;
    ETUDE_LAUNCH(detail::cond::prepend_rows_bwd, detail::cond::grid<X>(total), tune::threads, 0, current().stream())
        (dev(dcond), dev(dtok), dev(dx), lc, steps, n, total);
    ETUDE_CUDA_CHECK_LAUNCH("prepend_rows_bwd");
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_condition;
}  // namespace etude::backend
