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
  static void gemm(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, float alpha, const float* a,
                   index_t lda, const float* b, index_t ldb, float beta, float* c, index_t ldc) {
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
      throw error("cpu::gemm: a dimension exceeds the 32-bit range of CBLAS; use smaller microbatches");
    if (m == 0 || n == 0) return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
                static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  }

  // ---- elementwise ---------------------------------------------------------------------------
  static void copy(float* dst, const float* src, index_t n) {
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) dst[i] = src[i];
  }
  static void fill_zero(float* dst, index_t n) {
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) dst[i] = 0.0f;
  }

  // ---- embeddings ----------------------------------------------------------------------------
  // Sinusoidal positions (s, d): cos of the first half, sin of the second, periods
  // 10000^(j / (half - 1)), computed in float the way AudioCraft does.
  static void sinusoid(float* out, index_t steps, index_t dim) {
    const index_t half = dim / 2;
#pragma omp parallel for schedule(static)
    for (index_t s = 0; s < steps; ++s)
      for (index_t j = 0; j < half; ++j) {
        const float e = static_cast<float>(j) / static_cast<float>(half - 1);
        const float phase = static_cast<float>(s) / std::pow(10000.0f, e);
        out[s * dim + j] = std::cos(phase);
        out[s * dim + half + j] = std::sin(phase);
      }
  }

  // x(b, s, :) = sum_k table_k(seq(b, k, s), :) + pos(s, :), summed in codebook order.
  static void embedding_fwd(float* x, const token_t* seq, const float* const* tables, const float* pos,
                            index_t batch, int codebooks, index_t steps, index_t dim) {
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < batch * steps; ++r) {
      const index_t b = r / steps, s = r % steps;
      float* out = x + r * dim;
      const float* e0 = tables[0] + static_cast<index_t>(seq[(b * codebooks) * steps + s]) * dim;
#pragma omp simd
      for (index_t j = 0; j < dim; ++j) out[j] = e0[j];
      for (int k = 1; k < codebooks; ++k) {
        const float* ek = tables[k] + static_cast<index_t>(seq[(b * codebooks + k) * steps + s]) * dim;
#pragma omp simd
        for (index_t j = 0; j < dim; ++j) out[j] += ek[j];
      }
      const float* p = pos + s * dim;
#pragma omp simd
      for (index_t j = 0; j < dim; ++j) out[j] += p[j];
    }
  }

  // dtable_k(seq(b, k, s), :) += dx(b, s, :). Each thread owns a slice of columns and walks the
  // positions in order, so the sum order never depends on the thread count.
  static void embedding_bwd(float* const* dtables, const float* dx, const token_t* seq, index_t batch,
                            int codebooks, index_t steps, index_t dim) {
    constexpr index_t chunk = 16;
    const index_t chunks = (dim + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) collapse(2)
    for (int k = 0; k < codebooks; ++k)
      for (index_t c = 0; c < chunks; ++c) {
        const index_t j0 = c * chunk, j1 = std::min(dim, j0 + chunk);
        for (index_t r = 0; r < batch * steps; ++r) {
          const index_t b = r / steps, s = r % steps;
          float* row = dtables[k] + static_cast<index_t>(seq[(b * codebooks + k) * steps + s]) * dim;
          const float* g = dx + r * dim;
          for (index_t j = j0; j < j1; ++j) row[j] += g[j];
        }
      }
  }

  // ---- LayerNorm (eps 1e-5, biased variance, statistics in double) -------------------------------
  static constexpr float layernorm_eps = 1e-5f;

  static void layernorm_fwd(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                            const float* beta, index_t rows, index_t dim) {
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < rows; ++r) {
      const float* xr = x + r * dim;
      double sum = 0.0;
#pragma omp simd reduction(+ : sum)
      for (index_t j = 0; j < dim; ++j) sum += xr[j];
      const double mu = sum / static_cast<double>(dim);
      double sq = 0.0;
#pragma omp simd reduction(+ : sq)
      for (index_t j = 0; j < dim; ++j) sq += (xr[j] - mu) * (xr[j] - mu);
      const auto m = static_cast<float>(mu);
      const auto rs = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(dim) + layernorm_eps));
      mean[r] = m;
      rstd[r] = rs;
      float* yr = y + r * dim;
#pragma omp simd
      for (index_t j = 0; j < dim; ++j) yr[j] = (xr[j] - m) * rs * gamma[j] + beta[j];
    }
  }

  // dx += LayerNorm'(dy); dgamma += sum_rows dy·x̂; dbeta += sum_rows dy.
  static void layernorm_bwd(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                            const float* mean, const float* rstd, const float* gamma, index_t rows, index_t dim) {
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < rows; ++r) {
      const float* xr = x + r * dim;
      const float* gr = dy + r * dim;
      const float m = mean[r], rs = rstd[r];
      double s1 = 0.0, s2 = 0.0;
#pragma omp simd reduction(+ : s1, s2)
      for (index_t j = 0; j < dim; ++j) {
        const float g = gr[j] * gamma[j];
        s1 += g;
        s2 += g * ((xr[j] - m) * rs);
      }
      const auto a = static_cast<float>(s1 / static_cast<double>(dim));
      const auto c = static_cast<float>(s2 / static_cast<double>(dim));
      float* dr = dx + r * dim;
#pragma omp simd
      for (index_t j = 0; j < dim; ++j) {
        const float xhat = (xr[j] - m) * rs;
        dr[j] += rs * (gr[j] * gamma[j] - a - xhat * c);
      }
    }
    column_sums(dgamma, dbeta, dy, x, mean, rstd, rows, dim);
  }

  // ---- attention -----------------------------------------------------------------------------
  // Causal multi-head self-attention over packed qkv (B·S, 3D) → att (B·S, D) and the
  // log-sum-exp of each score row, lse (B·S, H). Scores are 1/sqrt(hd)·q·k.
  static void attention_fwd(float* att, float* lse, const float* qkv, index_t batch, index_t steps, int heads,
                            index_t head_dim) {
    const index_t d = heads * head_dim, ld = 3 * d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    std::vector<float> scratch(static_cast<std::size_t>(threads() * steps * steps));
#pragma omp parallel for schedule(static)
    for (index_t bh = 0; bh < batch * heads; ++bh) {
      const index_t b = bh / heads, h = bh % heads;
      float* p = scratch.data() + omp_get_thread_num() * steps * steps;
      const float* q = qkv + b * steps * ld + h * head_dim;
      gemm(false, true, steps, steps, head_dim, scale, q, ld, q + d, ld, 0.0f, p, steps);
      for (index_t i = 0; i < steps; ++i) {
        float* row = p + i * steps;
        float mx = row[0];
        for (index_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (index_t j = 0; j <= i; ++j) {
          row[j] = cpu_detail::exp_cody_waite(row[j] - mx);
          sum += row[j];
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (index_t j = 0; j <= i; ++j) row[j] *= inv;
        for (index_t j = i + 1; j < steps; ++j) row[j] = 0.0f;
        lse[(b * steps + i) * heads + h] = mx + std::log(sum);
      }
      gemm(false, false, steps, head_dim, steps, 1.0f, p, steps, q + 2 * d, ld, 0.0f,
           att + b * steps * d + h * head_dim, d);
    }
  }

  // dqkv (B·S, 3D) = attention'(datt), recomputing the probabilities from q, k and lse.
  static void attention_bwd(float* dqkv, const float* datt, const float* qkv, const float* lse, index_t batch,
                            index_t steps, int heads, index_t head_dim) {
    const index_t d = heads * head_dim, ld = 3 * d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    std::vector<float> scratch(static_cast<std::size_t>(2 * threads() * steps * steps));
#pragma omp parallel for schedule(static)
    for (index_t bh = 0; bh < batch * heads; ++bh) {
      const index_t b = bh / heads, h = bh % heads;
      float* p = scratch.data() + 2 * omp_get_thread_num() * steps * steps;
      float* dp = p + steps * steps;
      const float* q = qkv + b * steps * ld + h * head_dim;
      const float* k = q + d;
      const float* v = q + 2 * d;
      const float* dout = datt + b * steps * d + h * head_dim;
      float* dq = dqkv + b * steps * ld + h * head_dim;
      float* dk = dq + d;
      float* dv = dq + 2 * d;
      gemm(false, true, steps, steps, head_dim, scale, q, ld, k, ld, 0.0f, p, steps);
      gemm(false, true, steps, steps, head_dim, 1.0f, dout, d, v, ld, 0.0f, dp, steps);
      for (index_t i = 0; i < steps; ++i) {
        float* pr = p + i * steps;
        float* dr = dp + i * steps;
        const float l = lse[(b * steps + i) * heads + h];
#pragma omp simd
        for (index_t j = 0; j <= i; ++j) pr[j] = cpu_detail::exp_cody_waite(pr[j] - l);
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (index_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
#pragma omp simd
        for (index_t j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dot);
        for (index_t j = i + 1; j < steps; ++j) pr[j] = dr[j] = 0.0f;
      }
      gemm(true, false, steps, head_dim, steps, 1.0f, p, steps, dout, d, 0.0f, dv, ld);
      gemm(false, false, steps, head_dim, steps, scale, dp, steps, k, ld, 0.0f, dq, ld);
      gemm(true, false, steps, head_dim, steps, scale, dp, steps, q, ld, 0.0f, dk, ld);
    }
  }

  // ---- GELU (exact erf) --------------------------------------------------------------------------
  static void gelu_fwd(float* y, const float* x, index_t n) {
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
  }
  // dx = dy · gelu'(x), in place over dy.
  static void gelu_bwd(float* dy, const float* x, index_t n) {
    constexpr float inv_sqrt_2pi = 0.39894228040143268f;
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) {
      const float cdf = 0.5f * (1.0f + std::erf(x[i] * 0.70710678118654752f));
      const float pdf = inv_sqrt_2pi * cpu_detail::exp_cody_waite(-0.5f * x[i] * x[i]);
      dy[i] *= cdf + x[i] * pdf;
    }
  }

  // ---- softmax cross-entropy ---------------------------------------------------------------------
  // For each row of logits (rows, card) with target[row] >= 0: adds the row's cross-entropy to
  // the returned sum and overwrites the row with weight · (softmax − one-hot); rows with target
  // −1 become zero. With weight 0 only the loss is computed and the logits are left alone.
  static double softmax_xent(float* logits, const token_t* target, index_t rows, index_t card, float weight) {
    double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (index_t r = 0; r < rows; ++r) {
      float* row = logits + r * card;
      const token_t t = target[r];
      if (t < 0) {
        if (weight != 0.0f)
#pragma omp simd
          for (index_t j = 0; j < card; ++j) row[j] = 0.0f;
        continue;
      }
      float mx = row[0];
#pragma omp simd reduction(max : mx)
      for (index_t j = 0; j < card; ++j) mx = std::max(mx, row[j]);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (index_t j = 0; j < card; ++j) sum += cpu_detail::exp_cody_waite(row[j] - mx);
      const float lse = mx + std::log(sum);
      total += static_cast<double>(lse) - static_cast<double>(row[t]);
      if (weight != 0.0f) {
#pragma omp simd
        for (index_t j = 0; j < card; ++j) row[j] = weight * cpu_detail::exp_cody_waite(row[j] - lse);
        row[t] -= weight;
      }
    }
    return total;
  }

  // ---- optimiser and norms -----------------------------------------------------------------------
  // Sum of squares in double over fixed 4096-element blocks, added in block order.
  static double sum_squares(const float* x, index_t n) {
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
  static bool all_finite(const float* x, index_t n) {
    int bad = 0;
#pragma omp parallel for simd schedule(static) reduction(| : bad)
    for (index_t i = 0; i < n; ++i) bad |= !std::isfinite(x[i]);
    return bad == 0;
  }

  // AdamW (PyTorch's formulation) on g = grad·grad_scale at update number `step` (from 1):
  // p ← p(1 − lr·wd); m ← m + (1−β1)(g − m); v ← β2 v + (1−β2) g²;
  // p ← p − (lr/(1−β1^t))·m / (sqrt(v)/sqrt(1−β2^t) + eps). Scalars are formed in double.
  static void adamw_update(float* p, const float* grad, float* m, float* v, index_t n, double lr, double beta1,
                           double beta2, double eps, double weight_decay, long step, float grad_scale) {
    const double t = static_cast<double>(step);
    const auto step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, t)));
    const auto bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)));
    const auto decay = static_cast<float>(1.0 - lr * weight_decay);
    const auto w1 = static_cast<float>(1.0 - beta1), b2 = static_cast<float>(beta2),
               w2 = static_cast<float>(1.0 - beta2), e = static_cast<float>(eps);
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) {
      const float g = grad[i] * grad_scale;
      p[i] *= decay;
      m[i] += w1 * (g - m[i]);
      v[i] = v[i] * b2 + w2 * g * g;
      p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + e);
    }
  }

  // SGD with momentum (PyTorch's): g ← g·grad_scale + wd·p; buf ← μ buf + g (buf ← g on the
  // first update); p ← p − lr·(nesterov ? g + μ buf : buf).
  static void sgd_update(float* p, const float* grad, float* buf, index_t n, double lr, double momentum,
                         double weight_decay, bool nesterov, bool first_step, float grad_scale) {
    const auto l = static_cast<float>(lr), mu = static_cast<float>(momentum), wd = static_cast<float>(weight_decay);
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) {
      const float g = grad[i] * grad_scale + wd * p[i];
      buf[i] = first_step ? g : mu * buf[i] + g;
      p[i] -= l * (nesterov ? g + mu * buf[i] : buf[i]);
    }
  }

 private:
  // dgamma += Σ_r dy·x̂, dbeta += Σ_r dy, each column owned by one thread, rows in order.
  static void column_sums(float* dgamma, float* dbeta, const float* dy, const float* x, const float* mean,
                          const float* rstd, index_t rows, index_t dim) {
    constexpr index_t chunk = 16;
    const index_t chunks = (dim + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (index_t c = 0; c < chunks; ++c) {
      const index_t j0 = c * chunk, j1 = std::min(dim, j0 + chunk);
      float g[chunk] = {}, bsum[chunk] = {};
      for (index_t r = 0; r < rows; ++r) {
        const float* xr = x + r * dim;
        const float* gr = dy + r * dim;
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
