// The CPU's LayerNorm (spec: ops/layernorm.hpp): statistics in double, eps 1e-5, biased variance;
// the backward's column sums owned by one thread per column block, rows in order. The residual
// fusion is an add and layernorm_fwd (the CPU declares no fusion: the model keeps the residual in
// the product, which rounds once).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_layernorm {
  static constexpr double layernorm_eps = 1e-5;

  template <class Y, class Lse, class X, class W>
  static void layernorm_fwd(Y* y, Lse* mean, Lse* rstd, const X* x, const W* gamma, const W* beta, index_t rows,
                            index_t dim) {
    using Compute = cpu_detail::compute_of<Lse>;
#pragma omp parallel for schedule(static) if (rows * dim > cpu_detail::parallel_min)
    for (index_t r = 0; r < rows; ++r) {
      const X* xr = x + r * dim;
      double sum = 0.0;
#pragma omp simd reduction(+ : sum)
      for (index_t j = 0; j < dim; ++j) sum += cpu_detail::convert<Compute>(xr[j]);
      const double mu = sum / static_cast<double>(dim);
      double sq = 0.0;
#pragma omp simd reduction(+ : sq)
      for (index_t j = 0; j < dim; ++j)
        sq += (cpu_detail::convert<Compute>(xr[j]) - mu) * (cpu_detail::convert<Compute>(xr[j]) - mu);
      const auto m = static_cast<Compute>(mu);
      const auto rs = static_cast<Compute>(1.0 / std::sqrt(sq / static_cast<double>(dim) + layernorm_eps));
      mean[r] = m;
      rstd[r] = rs;
      Y* yr = y + r * dim;
#pragma omp simd
      for (index_t j = 0; j < dim; ++j)
        yr[j] = cpu_detail::convert<Y>((cpu_detail::convert<Compute>(xr[j]) - m) * rs *
                                           cpu_detail::convert<Compute>(gamma[j]) +
                                       cpu_detail::convert<Compute>(beta[j]));
    }
  }

  // dx += LayerNorm'(dy); dgamma += sum_rows dy·x̂; dbeta += sum_rows dy.
  template <class DX, class G, class DY, class X, class Lse, class W>
  static void layernorm_bwd(DX* dx, G* dgamma, G* dbeta, const DY* dy, const X* x, const Lse* mean, const Lse* rstd,
                            const W* gamma, index_t rows, index_t dim) {
    using Compute = cpu_detail::compute_of<Lse>;
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < rows; ++r) {
      const X* xr = x + r * dim;
      const DY* gr = dy + r * dim;
      const Compute m = mean[r], rs = rstd[r];
      double s1 = 0.0, s2 = 0.0;
#pragma omp simd reduction(+ : s1, s2)
      for (index_t j = 0; j < dim; ++j) {
        const Compute g = cpu_detail::convert<Compute>(gr[j]) * cpu_detail::convert<Compute>(gamma[j]);
        s1 += g;
        s2 += g * ((cpu_detail::convert<Compute>(xr[j]) - m) * rs);
      }
      const auto a = static_cast<Compute>(s1 / static_cast<double>(dim));
      const auto c = static_cast<Compute>(s2 / static_cast<double>(dim));
      DX* dr = dx + r * dim;
#pragma omp simd
      for (index_t j = 0; j < dim; ++j) {
        const Compute xhat = (cpu_detail::convert<Compute>(xr[j]) - m) * rs;
        dr[j] = cpu_detail::convert<DX>(
            cpu_detail::convert<Compute>(dr[j]) +
            rs * (cpu_detail::convert<Compute>(gr[j]) * cpu_detail::convert<Compute>(gamma[j]) - a - xhat * c));
      }
    }
    column_sums(dgamma, dbeta, dy, x, mean, rstd, rows, dim);
  }

  // x_mid = x + r (rounded to X), then layernorm_fwd on x_mid.
  template <class X, class Y, class Lse, class W>
  static void residual_layernorm_fwd(X* x_mid, Y* y, Lse* mean, Lse* rstd, const X* x, const X* r, const W* gamma,
                                     const W* beta, index_t rows, index_t dim) {
    using Compute = cpu_detail::compute_of<Lse>;
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < rows * dim; ++i)
      x_mid[i] = cpu_detail::convert<X>(cpu_detail::convert<Compute>(x[i]) + cpu_detail::convert<Compute>(r[i]));
    layernorm_fwd(y, mean, rstd, x_mid, gamma, beta, rows, dim);
  }

 private:
  // dgamma += Σ_r dy·x̂, dbeta += Σ_r dy, each column owned by one thread, rows in order. A thread
  // owns a run of whole chunks of 16 columns and walks the rows once for all of them: the same
  // chains of additions as one chunk at a time, without reading every row once per chunk (tiny's
  // LayerNorm backward, 2048 rows × 256 in bf16: 0.277 → 0.21 ms a call, 2 threads, cold caches).
  template <class G, class DY, class X, class Lse>
  static void column_sums(G* dgamma, G* dbeta, const DY* dy, const X* x, const Lse* mean, const Lse* rstd, index_t rows,
                          index_t dim) {
    using Compute = cpu_detail::compute_of<Lse>;
    constexpr index_t chunk = 16;
    const index_t chunks = (dim + chunk - 1) / chunk;
#pragma omp parallel
    {
      const index_t team = omp_get_num_threads(), t = omp_get_thread_num();
      const index_t j0 = chunks * t / team * chunk, j1 = std::min(dim, chunks * (t + 1) / team * chunk);
      if (j0 < j1) {
        thread_local std::vector<Compute> sums;
        if (sums.size() < static_cast<std::size_t>(2 * (j1 - j0))) sums.resize(static_cast<std::size_t>(2 * (j1 - j0)));
        Compute* g = sums.data();
        Compute* bsum = g + (j1 - j0);
        std::fill(g, g + 2 * (j1 - j0), Compute(0));
        for (index_t r = 0; r < rows; ++r) {
          const X* xr = x + r * dim;
          const DY* gr = dy + r * dim;
          const Compute m = mean[r], rs = rstd[r];
#pragma omp simd
          for (index_t j = j0; j < j1; ++j) {
            const Compute gv = cpu_detail::convert<Compute>(gr[j]);
            g[j - j0] += gv * ((cpu_detail::convert<Compute>(xr[j]) - m) * rs);
            bsum[j - j0] += gv;
          }
        }
        for (index_t j = j0; j < j1; ++j) {
          dgamma[j] = cpu_detail::convert<G>(cpu_detail::convert<Compute>(dgamma[j]) + g[j - j0]);
          dbeta[j] = cpu_detail::convert<G>(cpu_detail::convert<Compute>(dbeta[j]) + bsum[j - j0]);
        }
      }
    }
  }
};

}  // namespace etude::backend
