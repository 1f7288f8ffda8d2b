// The CPU backend: etude's numerical oracle and a real backend for machines without a GPU.
// OpenMP threads for elementwise and row-wise work, CBLAS sgemm (Debian's OpenBLAS built with
// OpenMP, so both share one thread pool) for matrix products. Deterministic: the same inputs and
// thread count give bit-identical results (reductions have a fixed order; no atomics).
// The op set it implements is specified in backend/op_set.hpp.
//
// Storage types: every tensor argument may be float, double, etude::bf16 or etude::fp16
// independently (precision policies give each role its dtype). Arithmetic is float (double when
// the tensors are double): 16-bit values are widened on load and rounded to nearest even on
// store, so a mixed-precision step computes here exactly what its dtypes allow. Matrix products
// with 16-bit operands widen tiles into a fixed workspace and call sgemm on them.
#pragma once

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/config/optim.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"
#include "etude/ops/step_control.hpp"

namespace etude::backend {

namespace cpu_detail {
// The arithmetic type for tensors stored as T: double stays double, everything else is float.
template <class T>
using compute_of = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Load/store conversions; identity when the types agree, RNE when narrowing to 16 bits.
template <class To, class From>
inline To cv(From x) {
  if constexpr (std::is_same_v<To, From>) return x;
  else if constexpr (is_reduced_precision_v<From>) return static_cast<To>(static_cast<float>(x));
  else if constexpr (is_reduced_precision_v<To>) return To(static_cast<float>(x));
  else return static_cast<To>(x);
}
template <class T>
inline bool finite(T x) {
  return std::isfinite(static_cast<compute_of<T>>(cv<compute_of<T>>(x)));
}
}  // namespace cpu_detail

struct cpu {
  static constexpr const char* name = "cpu";

  static int threads() { return omp_get_max_threads(); }

  // ---- matrix products -----------------------------------------------------------------------
  // Row-major C(m, n) = alpha · op(A)(m, k) · op(B)(k, n) + beta · C. All-float and all-double
  // products go to CBLAS directly; any 16-bit operand sends the product through gemm_tiled.
  static constexpr index_t gemm_tile = 512;  // 3 MiB of workspace; fewer, larger sgemm calls
  // Floats of workspace a product with a 16-bit operand needs (three tiles); the caller passes it.
  static constexpr index_t gemm_workspace_floats = 3 * gemm_tile * gemm_tile;
  template <class TA, class TB, class TC>
  static constexpr bool gemm_is_blas = std::is_same_v<TA, TB> && std::is_same_v<TA, TC> &&
                                       (std::is_same_v<TA, float> || std::is_same_v<TA, double>);

  // Bytes of gemm workspace a precision policy's products need (0 when every product is BLAS).
  template <class Policy>
  static constexpr index_t gemm_workspace_bytes() {
    using W = typename Policy::param_t;
    using A = typename Policy::activation_t;
    using G = typename Policy::grad_t;
    return gemm_is_blas<W, A, G> ? 0 : gemm_workspace_floats * static_cast<index_t>(sizeof(float));
  }
  // Bytes the backend holds outside the trainer's buffers (a caching allocator's reserve, a
  // library handle's workspace): none on the CPU.
  static constexpr index_t reserve_bytes = 0;

  template <class TA, class TB, class TC>
  static void gemm(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, double alpha, const TA* a,
                   index_t lda, const TB* b, index_t ldb, double beta, TC* c, index_t ldc,
                   float* workspace = nullptr) {
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
      throw error("cpu::gemm: a dimension exceeds the 32-bit range of CBLAS; use smaller microbatches");
    if (m == 0 || n == 0) return;
    if constexpr (gemm_is_blas<TA, TB, TC>) {
      blas(trans_a, trans_b, m, n, k, static_cast<TA>(alpha), a, lda, b, ldb, static_cast<TA>(beta), c, ldc);
    } else {
      static_assert(!std::is_same_v<TA, double> && !std::is_same_v<TB, double> && !std::is_same_v<TC, double>,
                    "cpu::gemm: double operands cannot be mixed with other dtypes");
      if (workspace == nullptr)
        throw error("cpu::gemm: a product with a 16-bit operand needs a workspace of gemm_workspace_floats floats");
      gemm_tiled(workspace, trans_a, trans_b, m, n, k, static_cast<float>(alpha), a, lda, b, ldb, static_cast<float>(beta), c,
                 ldc);
    }
  }

  // ---- elementwise ---------------------------------------------------------------------------
  template <class D, class S>
  static void copy(D* dst, const S* src, index_t n) {
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) dst[i] = cpu_detail::cv<D>(src[i]);
  }
  template <class T>
  static void fill_zero(T* dst, index_t n) {
    if (n > 0) std::memset(static_cast<void*>(dst), 0, static_cast<std::size_t>(n) * sizeof(T));
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
        out[s * dim + j] = cpu_detail::cv<T>(static_cast<cpu_detail::compute_of<T>>(std::cos(phase)));
        out[s * dim + half + j] = cpu_detail::cv<T>(static_cast<cpu_detail::compute_of<T>>(std::sin(phase)));
      }
  }

  // x(b, s, :) = sum_k table_k(seq(b, k, s), :) + pos(s, :), summed in codebook order in the
  // compute type and rounded once.
  template <class X, class W, class P>
  static void embedding_fwd(X* x, const token_t* seq, const W* const* tables, const P* pos,
                            index_t batch, int codebooks, index_t steps, index_t dim) {
    using F = cpu_detail::compute_of<X>;
    constexpr index_t chunk = 256;
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < batch * steps; ++r) {
      const index_t b = r / steps, s = r % steps;
      X* out = x + r * dim;
      for (index_t j0 = 0; j0 < dim; j0 += chunk) {
        const index_t w = std::min(chunk, dim - j0);
        F acc[chunk];
        const W* e0 = tables[0] + static_cast<index_t>(seq[(b * codebooks) * steps + s]) * dim + j0;
#pragma omp simd
        for (index_t j = 0; j < w; ++j) acc[j] = cpu_detail::cv<F>(e0[j]);
        for (int k = 1; k < codebooks; ++k) {
          const W* ek = tables[k] + static_cast<index_t>(seq[(b * codebooks + k) * steps + s]) * dim + j0;
#pragma omp simd
          for (index_t j = 0; j < w; ++j) acc[j] += cpu_detail::cv<F>(ek[j]);
        }
        const P* p = pos + s * dim + j0;
#pragma omp simd
        for (index_t j = 0; j < w; ++j) out[j0 + j] = cpu_detail::cv<X>(acc[j] + cpu_detail::cv<F>(p[j]));
      }
    }
  }

  // dtable_k(seq(b, k, s), :) += dx(b, s, :). Each thread owns a slice of columns and walks the
  // positions in order, so the sum order never depends on the thread count.
  template <class G, class X>
  static void embedding_bwd(G* const* dtables, const X* dx, const token_t* seq, index_t batch,
                            int codebooks, index_t steps, index_t dim) {
    using F = cpu_detail::compute_of<G>;
    constexpr index_t chunk = 16;
    const index_t chunks = (dim + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) collapse(2)
    for (int k = 0; k < codebooks; ++k)
      for (index_t c = 0; c < chunks; ++c) {
        const index_t j0 = c * chunk, j1 = std::min(dim, j0 + chunk);
        for (index_t r = 0; r < batch * steps; ++r) {
          const index_t b = r / steps, s = r % steps;
          G* row = dtables[k] + static_cast<index_t>(seq[(b * codebooks + k) * steps + s]) * dim;
          const X* g = dx + r * dim;
          for (index_t j = j0; j < j1; ++j) row[j] = cpu_detail::cv<G>(cpu_detail::cv<F>(row[j]) + cpu_detail::cv<F>(g[j]));
        }
      }
  }

  // ---- LayerNorm (eps 1e-5, biased variance, statistics in double) -------------------------------
  static constexpr double layernorm_eps = 1e-5;

  template <class Y, class St, class X, class W>
  static void layernorm_fwd(Y* y, St* mean, St* rstd, const X* x, const W* gamma, const W* beta, index_t rows,
                            index_t dim) {
    using F = cpu_detail::compute_of<St>;
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < rows; ++r) {
      const X* xr = x + r * dim;
      double sum = 0.0;
#pragma omp simd reduction(+ : sum)
      for (index_t j = 0; j < dim; ++j) sum += cpu_detail::cv<F>(xr[j]);
      const double mu = sum / static_cast<double>(dim);
      double sq = 0.0;
#pragma omp simd reduction(+ : sq)
      for (index_t j = 0; j < dim; ++j) sq += (cpu_detail::cv<F>(xr[j]) - mu) * (cpu_detail::cv<F>(xr[j]) - mu);
      const auto m = static_cast<F>(mu);
      const auto rs = static_cast<F>(1.0 / std::sqrt(sq / static_cast<double>(dim) + layernorm_eps));
      mean[r] = m;
      rstd[r] = rs;
      Y* yr = y + r * dim;
#pragma omp simd
      for (index_t j = 0; j < dim; ++j)
        yr[j] = cpu_detail::cv<Y>((cpu_detail::cv<F>(xr[j]) - m) * rs * cpu_detail::cv<F>(gamma[j]) +
                                  cpu_detail::cv<F>(beta[j]));
    }
  }

  // dx += LayerNorm'(dy); dgamma += sum_rows dy·x̂; dbeta += sum_rows dy.
  template <class DX, class G, class DY, class X, class St, class W>
  static void layernorm_bwd(DX* dx, G* dgamma, G* dbeta, const DY* dy, const X* x, const St* mean, const St* rstd,
                            const W* gamma, index_t rows, index_t dim) {
    using F = cpu_detail::compute_of<St>;
#pragma omp parallel for schedule(static)
    for (index_t r = 0; r < rows; ++r) {
      const X* xr = x + r * dim;
      const DY* gr = dy + r * dim;
      const F m = mean[r], rs = rstd[r];
      double s1 = 0.0, s2 = 0.0;
#pragma omp simd reduction(+ : s1, s2)
      for (index_t j = 0; j < dim; ++j) {
        const F g = cpu_detail::cv<F>(gr[j]) * cpu_detail::cv<F>(gamma[j]);
        s1 += g;
        s2 += g * ((cpu_detail::cv<F>(xr[j]) - m) * rs);
      }
      const auto a = static_cast<F>(s1 / static_cast<double>(dim));
      const auto c = static_cast<F>(s2 / static_cast<double>(dim));
      DX* dr = dx + r * dim;
#pragma omp simd
      for (index_t j = 0; j < dim; ++j) {
        const F xhat = (cpu_detail::cv<F>(xr[j]) - m) * rs;
        dr[j] = cpu_detail::cv<DX>(cpu_detail::cv<F>(dr[j]) +
                                   rs * (cpu_detail::cv<F>(gr[j]) * cpu_detail::cv<F>(gamma[j]) - a - xhat * c));
      }
    }
    column_sums(dgamma, dbeta, dy, x, mean, rstd, rows, dim);
  }

  // ---- attention -----------------------------------------------------------------------------
  // Causal multi-head self-attention over packed qkv (B·S, 3D) → att (B·S, D) and the
  // log-sum-exp of each score row, lse (B·S, H). Scores are 1/sqrt(hd)·q·k. Query rows go in
  // blocks of `attention_rows`; a block only meets the keys at or before its last row, so the
  // masked upper triangle is never computed (beyond the diagonal blocks). With 16-bit qkv each
  // (sequence, head) is widened into the thread's slot first and its results rounded once.
  static constexpr index_t attention_rows = 64;

  // Scratch (in the compute type) attention_fwd/bwd need for sequences of `steps`: one slot per
  // thread; `staged` (16-bit tensors) adds room for one head's q, k, v, dO, dQ, dK, dV in float.
  static constexpr index_t attention_slot(index_t steps, index_t head_dim, bool staged) {
    return 2 * attention_rows * steps + (staged ? 7 * steps * head_dim : 0);
  }
  static constexpr index_t attention_scratch(index_t steps, index_t head_dim, bool staged, int thread_count) {
    return static_cast<index_t>(thread_count) * attention_slot(steps, head_dim, staged);
  }

  template <class A, class St>
  static void attention_fwd(A* att, St* lse, const A* qkv, index_t batch, index_t steps, int heads,
                            index_t head_dim, cpu_detail::compute_of<A>* scratch, index_t scratch_size) {
    using F = cpu_detail::compute_of<A>;
    constexpr bool staged = !std::is_same_v<A, F>;
    const index_t d = heads * head_dim, ld = 3 * d, slot = attention_slot(steps, head_dim, staged);
    const int slots = static_cast<int>(std::max<index_t>(1, std::min<index_t>(threads(), scratch_size / slot)));
    if (scratch_size < slot)
      throw error("cpu::attention_fwd: scratch of " + std::to_string(scratch_size) + " values is below one slot (" +
                  std::to_string(slot) + ")");
#pragma omp parallel for schedule(static) num_threads(slots)
    for (index_t bh = 0; bh < batch * heads; ++bh) {
      const index_t b = bh / heads, h = bh % heads;
      F* p = scratch + omp_get_thread_num() * slot;
      const A* q = qkv + b * steps * ld + h * head_dim;
      A* out = att + b * steps * d + h * head_dim;
      St* l = lse + b * steps * heads + h;
      if constexpr (!staged) {
        attention_fwd_head(p, q, q + d, q + 2 * d, ld, out, d, l, heads, steps, head_dim);
      } else {
        F* qf = p + 2 * attention_rows * steps;
        F* kf = qf + steps * head_dim;
        F* vf = kf + steps * head_dim;
        F* of = vf + steps * head_dim;
        widen_head(qf, q, ld, steps, head_dim);
        widen_head(kf, q + d, ld, steps, head_dim);
        widen_head(vf, q + 2 * d, ld, steps, head_dim);
        attention_fwd_head(p, qf, kf, vf, head_dim, of, head_dim, l, heads, steps, head_dim);
        narrow_head(out, d, of, steps, head_dim);
      }
    }
  }

  // dqkv (B·S, 3D) = attention'(datt), recomputing the probabilities from q, k and lse, block by
  // block of query rows; dK and dV accumulate over the blocks in order.
  template <class DQ, class A, class St>
  static void attention_bwd(DQ* dqkv, const A* datt, const A* qkv, const St* lse, index_t batch, index_t steps,
                            int heads, index_t head_dim, cpu_detail::compute_of<A>* scratch, index_t scratch_size) {
    using F = cpu_detail::compute_of<A>;
    constexpr bool staged = !std::is_same_v<A, F> || !std::is_same_v<DQ, F>;
    const index_t d = heads * head_dim, ld = 3 * d, slot = attention_slot(steps, head_dim, staged);
    const int slots = static_cast<int>(std::max<index_t>(1, std::min<index_t>(threads(), scratch_size / slot)));
    if (scratch_size < slot)
      throw error("cpu::attention_bwd: scratch of " + std::to_string(scratch_size) + " values is below one slot (" +
                  std::to_string(slot) + ")");
#pragma omp parallel for schedule(static) num_threads(slots)
    for (index_t bh = 0; bh < batch * heads; ++bh) {
      const index_t b = bh / heads, h = bh % heads;
      F* p = scratch + omp_get_thread_num() * slot;
      const A* q = qkv + b * steps * ld + h * head_dim;
      const A* dout = datt + b * steps * d + h * head_dim;
      DQ* dq = dqkv + b * steps * ld + h * head_dim;
      const St* l = lse + b * steps * heads + h;
      if constexpr (!staged) {
        attention_bwd_head(p, q, q + d, q + 2 * d, ld, dout, d, dq, dq + d, dq + 2 * d, ld, l, heads, steps, head_dim);
      } else {
        const index_t n = steps * head_dim;
        F* qf = p + 2 * attention_rows * steps;
        F *kf = qf + n, *vf = kf + n, *of = vf + n, *dqf = of + n, *dkf = dqf + n, *dvf = dkf + n;
        widen_head(qf, q, ld, steps, head_dim);
        widen_head(kf, q + d, ld, steps, head_dim);
        widen_head(vf, q + 2 * d, ld, steps, head_dim);
        widen_head(of, dout, d, steps, head_dim);
        attention_bwd_head(p, qf, kf, vf, head_dim, of, head_dim, dqf, dkf, dvf, head_dim, l, heads, steps, head_dim);
        narrow_head(dq, ld, dqf, steps, head_dim);
        narrow_head(dq + d, ld, dkf, steps, head_dim);
        narrow_head(dq + 2 * d, ld, dvf, steps, head_dim);
      }
    }
  }

  // ---- GELU (exact erf) --------------------------------------------------------------------------
  template <class Y, class X>
  static void gelu_fwd(Y* y, const X* x, index_t n) {
    using F = cpu_detail::compute_of<X>;
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) {
      const F v = cpu_detail::cv<F>(x[i]);
      y[i] = cpu_detail::cv<Y>(F(0.5) * v * (F(1.0) + cpu_detail::verf(v * F(0.70710678118654752440))));
    }
  }
  // dx = dy · gelu'(x), in place over dy.
  template <class DY, class X>
  static void gelu_bwd(DY* dy, const X* x, index_t n) {
    using F = cpu_detail::compute_of<X>;
    constexpr F inv_sqrt_2pi = F(0.398942280401432677940);
#pragma omp parallel for simd schedule(static)
    for (index_t i = 0; i < n; ++i) {
      const F v = cpu_detail::cv<F>(x[i]);
      const F cdf = F(0.5) * (F(1.0) + cpu_detail::verf(v * F(0.70710678118654752440)));
      const F pdf = inv_sqrt_2pi * cpu_detail::vexp(-F(0.5) * v * v);
      dy[i] = cpu_detail::cv<DY>(cpu_detail::cv<F>(dy[i]) * (cdf + v * pdf));
    }
  }

  // ---- softmax cross-entropy ---------------------------------------------------------------------
  // For each row of logits (rows, card) with target[row] >= 0: adds the row's cross-entropy to
  // the returned sum and overwrites the row with weight · (softmax − one-hot); rows with target
  // −1 become zero. With weight 0 only the loss is computed and the logits are left alone.
  template <class L>
  static double softmax_xent(L* logits, const token_t* target, index_t rows, index_t card, double weight_d) {
    using F = cpu_detail::compute_of<L>;
    const auto weight = static_cast<F>(weight_d);
    double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (index_t r = 0; r < rows; ++r) {
      L* row = logits + r * card;
      const token_t t = target[r];
      if (t < 0) {
        if (weight != F(0.0)) fill_zero(row, card);
        continue;
      }
      F mx = cpu_detail::cv<F>(row[0]);
#pragma omp simd reduction(max : mx)
      for (index_t j = 0; j < card; ++j) mx = std::max(mx, cpu_detail::cv<F>(row[j]));
      F sum = F(0.0);
#pragma omp simd reduction(+ : sum)
      for (index_t j = 0; j < card; ++j) sum += cpu_detail::vexp(cpu_detail::cv<F>(row[j]) - mx);
      const F lse = mx + std::log(sum);
      const F target_logit = cpu_detail::cv<F>(row[t]);
      total += static_cast<double>(lse) - static_cast<double>(target_logit);
      if (weight != F(0.0)) {
#pragma omp simd
        for (index_t j = 0; j < card; ++j) row[j] = cpu_detail::cv<L>(weight * cpu_detail::vexp(cpu_detail::cv<F>(row[j]) - lse));
        // the one-hot term joins the probability before rounding, as a fused kernel would
        row[t] = cpu_detail::cv<L>(weight * cpu_detail::vexp(target_logit - lse) - weight);
      }
    }
    return total;
  }

  // The step's form: *loss += the summed cross-entropy, the weight read from *weight (memory the
  // step's scalars live in, so one step body serves every backend).
  template <class L, class W>
  static void softmax_xent(L* logits, const token_t* target, index_t rows, index_t card, const W* weight,
                           double* loss) {
    *loss += softmax_xent(logits, target, rows, card, static_cast<double>(*weight));
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
      for (index_t i = blk * block; i < i1; ++i) {
        const double v = cpu_detail::cv<cpu_detail::compute_of<T>>(x[i]);
        s += v * v;
      }
      partial[static_cast<std::size_t>(blk)] = s;
    }
    double total = 0.0;
    for (double s : partial) total += s;
    return total;
  }

  // The step's form: *out = sum_squares(x, n).
  template <class T>
  static void sum_squares(const T* x, index_t n, double* out) {
    *out = sum_squares(x, n);
  }

  // Any NaN or infinity in x?
  template <class T>
  static bool all_finite(const T* x, index_t n) {
    int bad = 0;
#pragma omp parallel for simd schedule(static) reduction(| : bad)
    for (index_t i = 0; i < n; ++i) bad |= !cpu_detail::finite(x[i]);
    return bad == 0;
  }

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

  // ---- step control (ops/step_control.hpp) -----------------------------------------------------------
  static void step_control(const step_limits* in, const double* losses, int n, step_decision* out) {
    decide_step(*in, losses, n, *out);
  }
  template <class T>
  static void clear_unless(T* x, index_t n, const int* keep) {
    if (*keep == 0) fill_zero(x, n);
  }

 private:
  template <class T>
  static void blas(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                   const T* b, index_t ldb, T beta, T* c, index_t ldc) {
    const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
    if constexpr (std::is_same_v<T, double>)
      cblas_dgemm(CblasRowMajor, ta, tb, im, in, ik, alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                  c, static_cast<int>(ldc));
    else
      cblas_sgemm(CblasRowMajor, ta, tb, im, in, ik, alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
                  c, static_cast<int>(ldc));
  }

  // Widens a (rows, cols) block of a row-major matrix with leading dimension ld into a dense
  // float tile (row stride cols).
  template <class T>
  static void widen_tile(float* dst, const T* src, index_t ld, index_t rows, index_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 16384)
    for (index_t r = 0; r < rows; ++r) {
      const T* s = src + r * ld;
      float* d = dst + r * cols;
#pragma omp simd
      for (index_t c = 0; c < cols; ++c) d[c] = cpu_detail::cv<float>(s[c]);
    }
  }

  // C = alpha·op(A)·op(B) + beta·C with any storage types, in (gemm_tile)³ blocks: each block
  // of A and B widened to float, products summed over k in float (straight into C when C is
  // float, else in a float tile rounded once at the end). The k order is fixed, so results
  // are deterministic.
  template <class TA, class TB, class TC>
  static void gemm_tiled(float* wa, bool trans_a, bool trans_b, index_t m, index_t n, index_t k, float alpha, const TA* a,
                         index_t lda, const TB* b, index_t ldb, float beta, TC* c, index_t ldc) {
    constexpr index_t t = gemm_tile;
    float* wb = wa + t * t;
    float* wc = wb + t * t;
    for (index_t i0 = 0; i0 < m; i0 += t)
      for (index_t j0 = 0; j0 < n; j0 += t) {
        const index_t mi = std::min(t, m - i0), nj = std::min(t, n - j0);
        float* cf;
        index_t ldcf;
        if constexpr (std::is_same_v<TC, float>) {
          cf = c + i0 * ldc + j0;
          ldcf = ldc;
        } else {
          cf = wc;
          ldcf = nj;
          if (beta != 0.0f) widen_tile(wc, c + i0 * ldc + j0, ldc, mi, nj);
        }
        if (k == 0) {
          for (index_t r = 0; r < mi; ++r)
            for (index_t q = 0; q < nj; ++q) cf[r * ldcf + q] = beta == 0.0f ? 0.0f : beta * cf[r * ldcf + q];
        }
        for (index_t p0 = 0; p0 < k; p0 += t) {
          const index_t kp = std::min(t, k - p0);
          // op(A) block (mi, kp): stored (mi, kp) at a + i0·lda + p0, or transposed (kp, mi) at a + p0·lda + i0
          if (trans_a) widen_tile(wa, a + p0 * lda + i0, lda, kp, mi);
          else widen_tile(wa, a + i0 * lda + p0, lda, mi, kp);
          if (trans_b) widen_tile(wb, b + j0 * ldb + p0, ldb, nj, kp);
          else widen_tile(wb, b + p0 * ldb + j0, ldb, kp, nj);
          blas<float>(trans_a, trans_b, mi, nj, kp, alpha, wa, trans_a ? mi : kp, wb, trans_b ? kp : nj,
                      p0 == 0 ? beta : 1.0f, cf, ldcf);
        }
        if constexpr (!std::is_same_v<TC, float>) {
          for (index_t r = 0; r < mi; ++r)
            for (index_t q = 0; q < nj; ++q) c[(i0 + r) * ldc + j0 + q] = cpu_detail::cv<TC>(wc[r * nj + q]);
        }
      }
  }

  // One head of one sequence: q, k, v rows with stride ld; out rows with stride ldo; lse with
  // stride lse_ld. p: 2·attention_rows·steps of scratch.
  template <class F, class O, class St>
  static void attention_fwd_head(F* p, const F* q, const F* k, const F* v, index_t ld, O* out, index_t ldo, St* lse,
                                 index_t lse_ld, index_t steps, index_t head_dim) {
    const F scale = F(1.0) / std::sqrt(static_cast<F>(head_dim));
    const index_t blocks = (steps + attention_rows - 1) / attention_rows;
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * attention_rows, i1 = std::min(steps, i0 + attention_rows), rows = i1 - i0;
      // scores (rows, i1) against keys 0 .. i1-1, row stride i1
      blas<F>(false, true, rows, i1, head_dim, scale, q + i0 * ld, ld, k, ld, F(0.0), p, i1);
      for (index_t i = i0; i < i1; ++i) {
        F* row = p + (i - i0) * i1;
        F mx = row[0];
        for (index_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
        F sum = F(0.0);
#pragma omp simd reduction(+ : sum)
        for (index_t j = 0; j <= i; ++j) {
          row[j] = cpu_detail::vexp(row[j] - mx);
          sum += row[j];
        }
        const F inv = F(1.0) / sum;
#pragma omp simd
        for (index_t j = 0; j <= i; ++j) row[j] *= inv;
        for (index_t j = i + 1; j < i1; ++j) row[j] = F(0.0);
        lse[i * lse_ld] = static_cast<St>(mx + std::log(sum));
      }
      blas<F>(false, false, rows, head_dim, i1, F(1.0), p, i1, v, ld, F(0.0), out + i0 * ldo, ldo);
    }
  }

  template <class F, class St>
  static void attention_bwd_head(F* p, const F* q, const F* k, const F* v, index_t ld, const F* dout, index_t ldo,
                                 F* dq, F* dk, F* dv, index_t ldd, const St* lse, index_t lse_ld, index_t steps,
                                 index_t head_dim) {
    const F scale = F(1.0) / std::sqrt(static_cast<F>(head_dim));
    const index_t blocks = (steps + attention_rows - 1) / attention_rows;
    F* dp = p + attention_rows * steps;
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * attention_rows, i1 = std::min(steps, i0 + attention_rows), rows = i1 - i0;
      blas<F>(false, true, rows, i1, head_dim, scale, q + i0 * ld, ld, k, ld, F(0.0), p, i1);
      blas<F>(false, true, rows, i1, head_dim, F(1.0), dout + i0 * ldo, ldo, v, ld, F(0.0), dp, i1);
      for (index_t i = i0; i < i1; ++i) {
        F* pr = p + (i - i0) * i1;
        F* dr = dp + (i - i0) * i1;
        const F l = static_cast<F>(lse[i * lse_ld]);
#pragma omp simd
        for (index_t j = 0; j <= i; ++j) pr[j] = cpu_detail::vexp(pr[j] - l);
        F dot = F(0.0);
#pragma omp simd reduction(+ : dot)
        for (index_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
#pragma omp simd
        for (index_t j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dot);
        for (index_t j = i + 1; j < i1; ++j) pr[j] = dr[j] = F(0.0);
      }
      // dV(0..i1) += Pᵀ dO, dK(0..i1) += scale·dSᵀ Q, dQ(block) = scale·dS K; rows at or past
      // i0 of dK and dV are first written by this block
      if (i0 > 0) {
        blas<F>(true, false, i0, head_dim, rows, F(1.0), p, i1, dout + i0 * ldo, ldo, F(1.0), dv, ldd);
        blas<F>(true, false, i0, head_dim, rows, scale, dp, i1, q + i0 * ld, ld, F(1.0), dk, ldd);
      }
      blas<F>(true, false, rows, head_dim, rows, F(1.0), p + i0, i1, dout + i0 * ldo, ldo, F(0.0), dv + i0 * ldd, ldd);
      blas<F>(true, false, rows, head_dim, rows, scale, dp + i0, i1, q + i0 * ld, ld, F(0.0), dk + i0 * ldd, ldd);
      blas<F>(false, false, rows, head_dim, i1, scale, dp, i1, k, ld, F(0.0), dq + i0 * ldd, ldd);
    }
  }

  template <class F, class T>
  static void widen_head(F* dst, const T* src, index_t ld, index_t steps, index_t head_dim) {
    for (index_t s = 0; s < steps; ++s)
#pragma omp simd
      for (index_t j = 0; j < head_dim; ++j) dst[s * head_dim + j] = cpu_detail::cv<F>(src[s * ld + j]);
  }
  template <class T, class F>
  static void narrow_head(T* dst, index_t ld, const F* src, index_t steps, index_t head_dim) {
    for (index_t s = 0; s < steps; ++s)
#pragma omp simd
      for (index_t j = 0; j < head_dim; ++j) dst[s * ld + j] = cpu_detail::cv<T>(src[s * head_dim + j]);
  }

  // dgamma += Σ_r dy·x̂, dbeta += Σ_r dy, each column owned by one thread, rows in order.
  template <class G, class DY, class X, class St>
  static void column_sums(G* dgamma, G* dbeta, const DY* dy, const X* x, const St* mean, const St* rstd,
                          index_t rows, index_t dim) {
    using F = cpu_detail::compute_of<St>;
    constexpr index_t chunk = 16;
    const index_t chunks = (dim + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (index_t c = 0; c < chunks; ++c) {
      const index_t j0 = c * chunk, j1 = std::min(dim, j0 + chunk);
      F g[chunk] = {}, bsum[chunk] = {};
      for (index_t r = 0; r < rows; ++r) {
        const X* xr = x + r * dim;
        const DY* gr = dy + r * dim;
        for (index_t j = j0; j < j1; ++j) {
          const F gv = cpu_detail::cv<F>(gr[j]);
          g[j - j0] += gv * ((cpu_detail::cv<F>(xr[j]) - mean[r]) * rstd[r]);
          bsum[j - j0] += gv;
        }
      }
      for (index_t j = j0; j < j1; ++j) {
        dgamma[j] = cpu_detail::cv<G>(cpu_detail::cv<F>(dgamma[j]) + g[j - j0]);
        dbeta[j] = cpu_detail::cv<G>(cpu_detail::cv<F>(dbeta[j]) + bsum[j - j0]);
      }
    }
  }
};

}  // namespace etude::backend
