// The CPU backend: etude's numerical oracle and a real backend for machines without a GPU.
// OpenMP threads for elementwise and row-wise work, CBLAS sgemm (Debian's OpenBLAS built with
// OpenMP, so both share one thread pool) for matrix products. Deterministic: the same inputs and
// thread count give bit-identical results (reductions have a fixed order; no atomics).
// The op set it implements is specified in backend/op_set.hpp.
#pragma once

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <type_traits>
#include <cmath>
#include <vector>

#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu {
  static constexpr const char* name = "cpu";

  static int threads() { return omp_get_max_threads(); }

  // ---- matrix products -----------------------------------------------------------------------
  // Row-major C(m, n) = alpha · op(A)(m, k) · op(B)(k, n) + beta · C.
  template <class T>
  static void gemm(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, T alpha, const T* a,
                   index_t lda, const T* b, index_t ldb, T beta, T* c, index_t ldc) {
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
      throw error("cpu::gemm: a dimension exceeds the 32-bit range of CBLAS; use smaller microbatches");
    if (m == 0 || n == 0) return;
    const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
    if constexpr (std::is_same_v<T, double>)
      cblas_dgemm(CblasRowMajor, ta, tb, im, in, ik, alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                  c, static_cast<int>(ldc));
    else
      cblas_sgemm(CblasRowMajor, ta, tb, im, in, ik, alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                  c, static_cast<int>(ldc));
  }

  // ---- elementwise ---------------------------------------------------------------------------
  template <class T>
  static void copy(T* dst, const T* src, index_t n) {
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) dst[i] = src[i];
  }
  template <class T>
  static void fill_zero(T* dst, index_t n) {
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) dst[i] = T(0.0);
  }

  // ---- embeddings ----------------------------------------------------------------------------
  // Sinusoidal positions (s, d): cos of the first half, sin of the second, periods
  // 10000^(j / (half - 1)) (AudioCraft's). Computed in double and rounded once: in float the
  // phase at position 1500 already carries errors of 1e-4.
  template <class T>
  static void sinusoid(T* out, index_t steps, index_t dim) {
    const index_t half = dim / 2;
#pragma omp parallel for schedule(static)
    for (index_t s = 0; s < steps; ++s)
      for (index_t j = 0; j < half; ++j) {
        const double phase = static_cast<double>(s) / std::pow(10000.0, static_cast<double>(j) / static_cast<double>(half - 1));
        out[s * dim + j] = static_cast<T>(std::cos(phase));
        out[s * dim + half + j] = static_cast<T>(std::sin(phase));
      }
  }

  // x(b, s, :) = sum_k table_k(seq(b, k, s), :) + pos(s, :), summed in codebook order.
  template <class T>
  static void embedding_fwd(T* x, const token_t* seq, const T* const* tables, const T* pos,
                            index_t batch, int codebooks, index_t steps, index_t dim) {
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < batch * steps; ++r) {
      const index_t b = r / steps, s = r % steps;
      T* out = x + r * dim;
      const T* e0 = tables[0] + static_cast<index_t>(seq[(b * codebooks) * steps + s]) * dim;
#pragma omp simd
      for (index_t j = 0; j < dim; ++j) out[j] = e0[j];
      for (int k = 1; k < codebooks; ++k) {
        const T* ek = tables[k] + static_cast<index_t>(seq[(b * codebooks + k) * steps + s]) * dim;
#pragma omp simd
        for (index_t j = 0; j < dim; ++j) out[j] += ek[j];
      }
      const T* p = pos + s * dim;
#pragma omp simd
      for (index_t j = 0; j < dim; ++j) out[j] += p[j];
    }
  }

  // dtable_k(seq(b, k, s), :) += dx(b, s, :). Each thread owns a slice of columns and walks the
  // positions in order, so the sum order never depends on the thread count.
  template <class T>
  static void embedding_bwd(T* const* dtables, const T* dx, const token_t* seq, index_t batch,
                            int codebooks, index_t steps, index_t dim) {
    constexpr index_t chunk = 16;
    const index_t chunks = (dim + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) collapse(2)
    for (int k = 0; k < codebooks; ++k)
      for (index_t c = 0; c < chunks; ++c) {
        const index_t j0 = c * chunk, j1 = std::min(dim, j0 + chunk);
        for (index_t r = 0; r < batch * steps; ++r) {
          const index_t b = r / steps, s = r % steps;
          T* row = dtables[k] + static_cast<index_t>(seq[(b * codebooks + k) * steps + s]) * dim;
          const T* g = dx + r * dim;
          for (index_t j = j0; j < j1; ++j) row[j] += g[j];
        }
      }
  }

  // ---- LayerNorm (eps 1e-5, biased variance, statistics in double) -------------------------------
  static constexpr double layernorm_eps = 1e-5;

  template <class T>
  static void layernorm_fwd(T* y, T* mean, T* rstd, const T* x, const T* gamma,
                            const T* beta, index_t rows, index_t dim) {
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < rows; ++r) {
      const T* xr = x + r * dim;
      double sum = 0.0;
#pragma omp simd reduction(+ : sum)
      for (index_t j = 0; j < dim; ++j) sum += xr[j];
      const double mu = sum / static_cast<double>(dim);
      double sq = 0.0;
#pragma omp simd reduction(+ : sq)
      for (index_t j = 0; j < dim; ++j) sq += (xr[j] - mu) * (xr[j] - mu);
      const auto m = static_cast<T>(mu);
      const auto rs = static_cast<T>(1.0 / std::sqrt(sq / static_cast<double>(dim) + layernorm_eps));
      mean[r] = m;
      rstd[r] = rs;
      T* yr = y + r * dim;
#pragma omp simd
      for (index_t j = 0; j < dim; ++j) yr[j] = (xr[j] - m) * rs * gamma[j] + beta[j];
    }
  }

  // dx += LayerNorm'(dy); dgamma += sum_rows dy·x̂; dbeta += sum_rows dy.
  template <class T>
  static void layernorm_bwd(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x,
                            const T* mean, const T* rstd, const T* gamma, index_t rows, index_t dim) {
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < rows; ++r) {
      const T* xr = x + r * dim;
      const T* gr = dy + r * dim;
      const T m = mean[r], rs = rstd[r];
      double s1 = 0.0, s2 = 0.0;
#pragma omp simd reduction(+ : s1, s2)
      for (index_t j = 0; j < dim; ++j) {
        const T g = gr[j] * gamma[j];
        s1 += g;
        s2 += g * ((xr[j] - m) * rs);
      }
      const auto a = static_cast<T>(s1 / static_cast<double>(dim));
      const auto c = static_cast<T>(s2 / static_cast<double>(dim));
      T* dr = dx + r * dim;
#pragma omp simd
      for (index_t j = 0; j < dim; ++j) {
        const T xhat = (xr[j] - m) * rs;
        dr[j] += rs * (gr[j] * gamma[j] - a - xhat * c);
      }
    }
    column_sums(dgamma, dbeta, dy, x, mean, rstd, rows, dim);
  }

  // ---- attention -----------------------------------------------------------------------------
  // Causal multi-head self-attention over packed qkv (B·S, 3D) → att (B·S, D) and the
  // log-sum-exp of each score row, lse (B·S, H). Scores are 1/sqrt(hd)·q·k. Query rows go in
  // blocks of `attention_rows`; a block only meets the keys at or before its last row, so the
  // masked upper triangle is never computed (beyond the diagonal blocks).
  static constexpr index_t attention_rows = 64;

  // Scratch floats attention_fwd/bwd need for sequences of `steps` (one slot per thread).
  static index_t attention_scratch(index_t steps) {
    return static_cast<index_t>(threads()) * 2 * attention_rows * steps;
  }

  template <class T>
  static void attention_fwd(T* att, T* lse, const T* qkv, index_t batch, index_t steps, int heads,
                            index_t head_dim, T* scratch, index_t scratch_size) {
    const index_t d = heads * head_dim, ld = 3 * d, slot = 2 * attention_rows * steps;
    const T scale = T(1.0) / std::sqrt(static_cast<T>(head_dim));
    const int slots = static_cast<int>(std::max<index_t>(1, std::min<index_t>(threads(), scratch_size / slot)));
    const index_t blocks = (steps + attention_rows - 1) / attention_rows;
#pragma omp parallel for schedule(static) num_threads(slots)
    for (index_t bh = 0; bh < batch * heads; ++bh) {
      const index_t b = bh / heads, h = bh % heads;
      T* p = scratch + omp_get_thread_num() * slot;
      const T* q = qkv + b * steps * ld + h * head_dim;
      for (index_t blk = 0; blk < blocks; ++blk) {
        const index_t i0 = blk * attention_rows, i1 = std::min(steps, i0 + attention_rows), rows = i1 - i0;
        // scores (rows, i1) against keys 0 .. i1-1, row stride i1
        gemm(false, true, rows, i1, head_dim, scale, q + i0 * ld, ld, q + d, ld, T(0.0), p, i1);
        for (index_t i = i0; i < i1; ++i) {
          T* row = p + (i - i0) * i1;
          T mx = row[0];
          for (index_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
          T sum = T(0.0);
#pragma omp simd reduction(+ : sum)
          for (index_t j = 0; j <= i; ++j) {
            row[j] = cpu_detail::vexp(row[j] - mx);
            sum += row[j];
          }
          const T inv = T(1.0) / sum;
#pragma omp simd
          for (index_t j = 0; j <= i; ++j) row[j] *= inv;
          for (index_t j = i + 1; j < i1; ++j) row[j] = T(0.0);
          lse[(b * steps + i) * heads + h] = mx + std::log(sum);
        }
        gemm(false, false, rows, head_dim, i1, T(1.0), p, i1, q + 2 * d, ld, T(0.0),
             att + (b * steps + i0) * d + h * head_dim, d);
      }
    }
  }

  // dqkv (B·S, 3D) = attention'(datt), recomputing the probabilities from q, k and lse, block by
  // block of query rows; dK and dV accumulate over the blocks in order.
  template <class T>
  static void attention_bwd(T* dqkv, const T* datt, const T* qkv, const T* lse, index_t batch,
                            index_t steps, int heads, index_t head_dim, T* scratch, index_t scratch_size) {
    const index_t d = heads * head_dim, ld = 3 * d, slot = 2 * attention_rows * steps;
    const T scale = T(1.0) / std::sqrt(static_cast<T>(head_dim));
    const int slots = static_cast<int>(std::max<index_t>(1, std::min<index_t>(threads(), scratch_size / slot)));
    const index_t blocks = (steps + attention_rows - 1) / attention_rows;
#pragma omp parallel for schedule(static) num_threads(slots)
    for (index_t bh = 0; bh < batch * heads; ++bh) {
      const index_t b = bh / heads, h = bh % heads;
      T* p = scratch + omp_get_thread_num() * slot;
      T* dp = p + attention_rows * steps;
      const T* q = qkv + b * steps * ld + h * head_dim;
      const T* k = q + d;
      const T* v = q + 2 * d;
      const T* dout = datt + b * steps * d + h * head_dim;
      T* dq = dqkv + b * steps * ld + h * head_dim;
      T* dk = dq + d;
      T* dv = dq + 2 * d;
      for (index_t blk = 0; blk < blocks; ++blk) {
        const index_t i0 = blk * attention_rows, i1 = std::min(steps, i0 + attention_rows), rows = i1 - i0;
        gemm(false, true, rows, i1, head_dim, scale, q + i0 * ld, ld, k, ld, T(0.0), p, i1);
        gemm(false, true, rows, i1, head_dim, T(1.0), dout + i0 * d, d, v, ld, T(0.0), dp, i1);
        for (index_t i = i0; i < i1; ++i) {
          T* pr = p + (i - i0) * i1;
          T* dr = dp + (i - i0) * i1;
          const T l = lse[(b * steps + i) * heads + h];
#pragma omp simd
          for (index_t j = 0; j <= i; ++j) pr[j] = cpu_detail::vexp(pr[j] - l);
          T dot = T(0.0);
#pragma omp simd reduction(+ : dot)
          for (index_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
#pragma omp simd
          for (index_t j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dot);
          for (index_t j = i + 1; j < i1; ++j) pr[j] = dr[j] = T(0.0);
        }
        // dV(0..i1) += Pᵀ dO, dK(0..i1) += scale·dSᵀ Q, dQ(block) = scale·dS K; rows at or past
        // i0 of dK and dV are first written by this block
        const T first = T(0.0), more = T(1.0);
        if (i0 > 0) {
          gemm(true, false, i0, head_dim, rows, T(1.0), p, i1, dout + i0 * d, d, more, dv, ld);
          gemm(true, false, i0, head_dim, rows, scale, dp, i1, q + i0 * ld, ld, more, dk, ld);
        }
        gemm(true, false, rows, head_dim, rows, T(1.0), p + i0, i1, dout + i0 * d, d, first, dv + i0 * ld, ld);
        gemm(true, false, rows, head_dim, rows, scale, dp + i0, i1, q + i0 * ld, ld, first, dk + i0 * ld, ld);
        gemm(false, false, rows, head_dim, i1, scale, dp, i1, k, ld, T(0.0), dq + i0 * ld, ld);
      }
    }
  }

  // ---- GELU (exact erf) --------------------------------------------------------------------------
  template <class T>
  static void gelu_fwd(T* y, const T* x, index_t n) {
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) y[i] = T(0.5) * x[i] * (T(1.0) + cpu_detail::verf(x[i] * T(0.70710678118654752440)));
  }
  // dx = dy · gelu'(x), in place over dy.
  template <class T>
  static void gelu_bwd(T* dy, const T* x, index_t n) {
    constexpr T inv_sqrt_2pi = T(0.398942280401432677940);
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) {
      const T cdf = T(0.5) * (T(1.0) + cpu_detail::verf(x[i] * T(0.70710678118654752440)));
      const T pdf = inv_sqrt_2pi * cpu_detail::vexp(-T(0.5) * x[i] * x[i]);
      dy[i] *= cdf + x[i] * pdf;
    }
  }

  // ---- softmax cross-entropy ---------------------------------------------------------------------
  // For each row of logits (rows, card) with target[row] >= 0: adds the row's cross-entropy to
  // the returned sum and overwrites the row with weight · (softmax − one-hot); rows with target
  // −1 become zero. With weight 0 only the loss is computed and the logits are left alone.
  template <class T>
  static double softmax_xent(T* logits, const token_t* target, index_t rows, index_t card, T weight) {
    double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (index_t r = 0; r < rows; ++r) {
      T* row = logits + r * card;
      const token_t t = target[r];
      if (t < 0) {
        if (weight != T(0.0))
#pragma omp simd
          for (index_t j = 0; j < card; ++j) row[j] = T(0.0);
        continue;
      }
      T mx = row[0];
#pragma omp simd reduction(max : mx)
      for (index_t j = 0; j < card; ++j) mx = std::max(mx, row[j]);
      T sum = T(0.0);
#pragma omp simd reduction(+ : sum)
      for (index_t j = 0; j < card; ++j) sum += cpu_detail::vexp(row[j] - mx);
      const T lse = mx + std::log(sum);
      total += static_cast<double>(lse) - static_cast<double>(row[t]);
      if (weight != T(0.0)) {
#pragma omp simd
        for (index_t j = 0; j < card; ++j) row[j] = weight * cpu_detail::vexp(row[j] - lse);
        row[t] -= weight;
      }
    }
    return total;
  }

  // ---- optimiser and norms -----------------------------------------------------------------------
  // Sum of squares in double over fixed 4096-element blocks, added in block order.
  template <class T>
  static double sum_squares(const T* x, index_t n) {
    constexpr index_t block = 4096;
    const index_t blocks = (n + block - 1) / block;
    std::vector<double> partial(static_cast<std::size_t>(blocks));
#pragma omp parallel for schedule(static)
    for (index_t blk = 0; blk < blocks; ++blk) {
      double s = 0.0;
      const index_t i1 = std::min(n, (blk + 1) * block);
#pragma omp simd reduction(+ : s)
      for (index_t i = blk * block; i < i1; ++i) s += static_cast<double>(x[i]) * x[i];
      partial[static_cast<std::size_t>(blk)] = s;
    }
    double total = 0.0;
    for (double s : partial) total += s;
    return total;
  }

  // Any NaN or infinity in x?
  template <class T>
  static bool all_finite(const T* x, index_t n) {
    int bad = 0;
#pragma omp parallel for simd schedule(static) reduction(| : bad)
    for (index_t i = 0; i < n; ++i) bad |= !std::isfinite(x[i]);
    return bad == 0;
  }

  // AdamW (PyTorch's formulation) on g = grad·grad_scale at update number `step` (from 1):
  // p ← p(1 − lr·wd); m ← m + (1−β1)(g − m); v ← β2 v + (1−β2) g²;
  // p ← p − (lr/(1−β1^t))·m / (sqrt(v)/sqrt(1−β2^t) + eps). Scalars are formed in double.
  template <class T>
  static void adamw_update(T* p, const T* grad, T* m, T* v, index_t n, double lr, double beta1,
                           double beta2, double eps, double weight_decay, long step, T grad_scale) {
    const double t = static_cast<double>(step);
    const auto step_size = static_cast<T>(lr / (1.0 - std::pow(beta1, t)));
    const auto bc2_sqrt = static_cast<T>(std::sqrt(1.0 - std::pow(beta2, t)));
    const auto decay = static_cast<T>(1.0 - lr * weight_decay);
    const auto w1 = static_cast<T>(1.0 - beta1), b2 = static_cast<T>(beta2),
               w2 = static_cast<T>(1.0 - beta2), e = static_cast<T>(eps);
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) {
      const T g = grad[i] * grad_scale;
      p[i] *= decay;
      m[i] += w1 * (g - m[i]);
      v[i] = v[i] * b2 + w2 * g * g;
      p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + e);
    }
  }

  // SGD with momentum (PyTorch's): g ← g·grad_scale + wd·p; buf ← μ buf + g (buf ← g on the
  // first update); p ← p − lr·(nesterov ? g + μ buf : buf).
  template <class T>
  static void sgd_update(T* p, const T* grad, T* buf, index_t n, double lr, double momentum,
                         double weight_decay, bool nesterov, bool first_step, T grad_scale) {
    const auto l = static_cast<T>(lr), mu = static_cast<T>(momentum), wd = static_cast<T>(weight_decay);
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) {
      const T g = grad[i] * grad_scale + wd * p[i];
      buf[i] = first_step ? g : mu * buf[i] + g;
      p[i] -= l * (nesterov ? g + mu * buf[i] : buf[i]);
    }
  }

 private:
  // dgamma += Σ_r dy·x̂, dbeta += Σ_r dy, each column owned by one thread, rows in order.
  template <class T>
  static void column_sums(T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                          const T* rstd, index_t rows, index_t dim) {
    constexpr index_t chunk = 16;
    const index_t chunks = (dim + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (index_t c = 0; c < chunks; ++c) {
      const index_t j0 = c * chunk, j1 = std::min(dim, j0 + chunk);
      T g[chunk] = {}, bsum[chunk] = {};
      for (index_t r = 0; r < rows; ++r) {
        const T* xr = x + r * dim;
        const T* gr = dy + r * dim;
        for (index_t j = j0; j < j1; ++j) {
          g[j - j0] += gr[j] * ((xr[j] - mean[r]) * rstd[r]);
          bsum[j - j0] += gr[j];
        }
      }
      for (index_t j = j0; j < j1; ++j) {
        dgamma[j] += g[j - j0];
        dbeta[j] += bsum[j - j0];
      }
    }
  }
};

}  // namespace etude::backend
