// The CPU's causal self-attention (spec: ops/attention.hpp): per (sequence, head), query rows in
// blocks against only the keys at or before the block's last row, the products through
// cpu_gemm::dense in the compute type, each (sequence, head) on one thread; the backward
// recomputes the probabilities from q, k and lse.
// Long sequences take blocks of 128 rows: the products are most of the time, and taller blocks
// run them faster once a row's keys outnumber the masked corner a tall diagonal block wastes.
// Measured on 2 AVX-512 cores (head dim 64, step_bench tiny_long --profile, T=2048, forward and
// backward ms per step): fp32 on oneDNN 72 and 152 with 64 or 128 rows alike; bf16 on the dot
// products 48 and 86 with 128 rows, 54 and 101 with 64.
// bf16 q, k, v and dO meet each other on the CPU's bf16 dot-product instructions where cpu_gemm
// has them (bf16_dot_products()): scores and dP straight from the packed tensors, the
// probabilities and dS rounded to bf16 (as the CUDA kernel rounds them) to meet V, dO, Q and K.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/heads.hpp"
#include "etude/backend/cpu/gemm.hpp"
#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_attention {
  // Causal multi-head self-attention over packed qkv (B·S, 3D) → att (B·S, D) and the
  // log-sum-exp of each score row, lse (B·S, H). Scores are 1/sqrt(hd)·q·k. Query rows go in
  // blocks of `attention_rows(S)`; a block only meets the keys at or before its last row, so the
  // masked upper triangle is never computed (beyond the diagonal blocks). With 16-bit qkv each
  // (sequence, head) is widened into the thread's slot first and its results rounded once.
  static constexpr index_t max_attention_rows = 128;
  static constexpr index_t attention_rows(index_t steps) { return steps > 512 ? max_attention_rows : 64; }

  // Scratch (in the compute type) attention_fwd/bwd need for sequences of `steps`: one slot per
  // thread; `staged` (16-bit tensors) adds room for one head's q, k, v, dO, dQ, dK, dV in float,
  // or for a block's bf16 probabilities and dS where those meet the bf16 dot products.
  static constexpr index_t attention_slot(index_t steps, index_t head_dim, bool staged) {
    return 2 * attention_rows(steps) * steps + (staged ? 7 * steps * head_dim + attention_rows(steps) * steps : 0);
  }
  static constexpr index_t attention_scratch(index_t steps, index_t head_dim, bool staged, int thread_count) {
    return static_cast<index_t>(thread_count) * attention_slot(steps, head_dim, staged);
  }

  // The head dimension is the model's, a compile-time value (ops/attention.hpp); the CPU's loops
  // take any.
  template <int HeadDim, class A, class St>
  static void attention_fwd(A* att, St* lse, const A* qkv, index_t batch, index_t steps, int heads,
                            cpu_detail::compute_of<A>* scratch, index_t scratch_size) {
    static_assert(HeadDim > 0, "cpu::attention_fwd: the head dimension must be positive");
    forward(att, lse, qkv, batch, steps, heads, HeadDim, scratch, scratch_size);
  }
  template <int HeadDim, class DQ, class A, class St>
  static void attention_bwd(DQ* dqkv, const A* datt, const A* att, const A* qkv, const St* lse, index_t batch,
                            index_t steps, int heads, cpu_detail::compute_of<A>* scratch, index_t scratch_size) {
    static_assert(HeadDim > 0, "cpu::attention_bwd: the head dimension must be positive");
    backward(dqkv, datt, att, qkv, lse, batch, steps, heads, HeadDim, scratch, scratch_size);
  }

 private:
  template <class A, class St>
  static void forward(A* att, St* lse, const A* qkv, index_t batch, index_t steps, int heads, index_t head_dim,
                      cpu_detail::compute_of<A>* scratch, index_t scratch_size) {
    using F = cpu_detail::compute_of<A>;
    constexpr bool staged = !std::is_same_v<A, F>;
    const index_t d = heads * head_dim, ld = 3 * d, slot = attention_slot(steps, head_dim, staged);
    const int slots = cpu_detail::slot_count("cpu::attention_fwd", slot, scratch_size);
    const bool dot16 = std::is_same_v<A, bf16> && cpu_gemm::bf16_dot_products();  // the same for every head
#pragma omp parallel for schedule(static) num_threads(slots)
    for (index_t bh = 0; bh < batch * heads; ++bh) {
      const index_t b = bh / heads, h = bh % heads;
      F* p = scratch + omp_get_thread_num() * slot;
      const A* q = qkv + b * steps * ld + h * head_dim;
      A* out = att + b * steps * d + h * head_dim;
      St* l = lse + b * steps * heads + h;
      if constexpr (!staged) {
        attention_fwd_head(p, q, q + d, q + 2 * d, ld, out, d, l, heads, steps, head_dim);
      } else if (dot16) {
        if constexpr (std::is_same_v<A, bf16>) attention_fwd_head_bf16(p, q, ld, out, d, l, heads, steps, head_dim, d);
      } else {
        F* qf = p + 2 * attention_rows(steps) * steps;
        F* kf = qf + steps * head_dim;
        F* vf = kf + steps * head_dim;
        F* of = vf + steps * head_dim;
        cpu_detail::widen_head(qf, q, ld, steps, head_dim);
        cpu_detail::widen_head(kf, q + d, ld, steps, head_dim);
        cpu_detail::widen_head(vf, q + 2 * d, ld, steps, head_dim);
        attention_fwd_head(p, qf, kf, vf, head_dim, of, head_dim, l, heads, steps, head_dim);
        cpu_detail::narrow_head(out, d, of, steps, head_dim);
      }
    }
  }

  // dqkv (B·S, 3D) = attention'(datt), recomputing the probabilities from q, k and lse, block by
  // block of query rows; dK and dV accumulate over the blocks in order. att (the forward's output)
  // is not read: the row terms dO·O come from P and dP here.
  template <class DQ, class A, class St>
  static void backward(DQ* dqkv, const A* datt, const A* /*att*/, const A* qkv, const St* lse, index_t batch,
                       index_t steps, int heads, index_t head_dim, cpu_detail::compute_of<A>* scratch,
                       index_t scratch_size) {
    using F = cpu_detail::compute_of<A>;
    constexpr bool staged = !std::is_same_v<A, F> || !std::is_same_v<DQ, F>;
    const index_t d = heads * head_dim, ld = 3 * d, slot = attention_slot(steps, head_dim, staged);
    const int slots = cpu_detail::slot_count("cpu::attention_bwd", slot, scratch_size);
    const bool dot16 = std::is_same_v<A, bf16> && cpu_gemm::bf16_dot_products();  // the same for every head
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
      } else if (dot16) {
        if constexpr (std::is_same_v<A, bf16>)
          attention_bwd_head_bf16(p, q, ld, dout, d, dq, ld, l, heads, steps, head_dim, d);
      } else {
        const index_t n = steps * head_dim;
        F* qf = p + 2 * attention_rows(steps) * steps;
        F *kf = qf + n, *vf = kf + n, *of = vf + n, *dqf = of + n, *dkf = dqf + n, *dvf = dkf + n;
        cpu_detail::widen_head(qf, q, ld, steps, head_dim);
        cpu_detail::widen_head(kf, q + d, ld, steps, head_dim);
        cpu_detail::widen_head(vf, q + 2 * d, ld, steps, head_dim);
        cpu_detail::widen_head(of, dout, d, steps, head_dim);
        attention_bwd_head(p, qf, kf, vf, head_dim, of, head_dim, dqf, dkf, dvf, head_dim, l, heads, steps, head_dim);
        cpu_detail::narrow_head(dq, ld, dqf, steps, head_dim);
        cpu_detail::narrow_head(dq + d, ld, dkf, steps, head_dim);
        cpu_detail::narrow_head(dq + 2 * d, ld, dvf, steps, head_dim);
      }
    }
  }

  // One head of one sequence: q, k, v rows with stride ld; out rows with stride ldo; lse with
  // stride lse_ld. p: 2·attention_rows(steps)·steps of scratch. The probabilities meet V
  // unnormalised; each output row is divided by its sum after the product (head_dim values, not
  // a pass over the row's keys).
  template <class F, class O, class St>
  static void attention_fwd_head(F* p, const F* q, const F* k, const F* v, index_t ld, O* out, index_t ldo, St* lse,
                                 index_t lse_ld, index_t steps, index_t head_dim) {
    const F scale = F(1.0) / std::sqrt(static_cast<F>(head_dim));
    const index_t block = attention_rows(steps), blocks = (steps + block - 1) / block;
    F inv[max_attention_rows];
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * block, i1 = std::min(steps, i0 + block), rows = i1 - i0;
      // scores (rows, i1) against keys 0 .. i1-1, row stride i1
      cpu_gemm::dense<F>(false, true, rows, i1, head_dim, scale, q + i0 * ld, ld, k, ld, F(0.0), p, i1);
      for (index_t i = i0; i < i1; ++i) {
        F* row = p + (i - i0) * i1;
        F mx = row[0];
#pragma omp simd reduction(max : mx)
        for (index_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
        F sum = F(0.0);
#pragma omp simd reduction(+ : sum)
        for (index_t j = 0; j <= i; ++j) {
          row[j] = cpu_detail::vexp(row[j] - mx);
          sum += row[j];
        }
        inv[i - i0] = F(1.0) / sum;
        for (index_t j = i + 1; j < i1; ++j) row[j] = F(0.0);
        lse[i * lse_ld] = static_cast<St>(mx + std::log(sum));
      }
      cpu_gemm::dense<F>(false, false, rows, head_dim, i1, F(1.0), p, i1, v, ld, F(0.0), out + i0 * ldo, ldo);
      for (index_t r = 0; r < rows; ++r) {
        O* o = out + (i0 + r) * ldo;
        const F s = inv[r];
#pragma omp simd
        for (index_t c = 0; c < head_dim; ++c) o[c] = o[c] * s;
      }
    }
  }

  template <class F, class St>
  static void attention_bwd_head(F* p, const F* q, const F* k, const F* v, index_t ld, const F* dout, index_t ldo,
                                 F* dq, F* dk, F* dv, index_t ldd, const St* lse, index_t lse_ld, index_t steps,
                                 index_t head_dim) {
    const F scale = F(1.0) / std::sqrt(static_cast<F>(head_dim));
    const index_t block = attention_rows(steps), blocks = (steps + block - 1) / block;
    F* dp = p + block * steps;
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * block, i1 = std::min(steps, i0 + block), rows = i1 - i0;
      cpu_gemm::dense<F>(false, true, rows, i1, head_dim, scale, q + i0 * ld, ld, k, ld, F(0.0), p, i1);
      cpu_gemm::dense<F>(false, true, rows, i1, head_dim, F(1.0), dout + i0 * ldo, ldo, v, ld, F(0.0), dp, i1);
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
        cpu_gemm::dense<F>(true, false, i0, head_dim, rows, F(1.0), p, i1, dout + i0 * ldo, ldo, F(1.0), dv, ldd);
        cpu_gemm::dense<F>(true, false, i0, head_dim, rows, scale, dp, i1, q + i0 * ld, ld, F(1.0), dk, ldd);
      }
      cpu_gemm::dense<F>(true, false, rows, head_dim, rows, F(1.0), p + i0, i1, dout + i0 * ldo, ldo, F(0.0),
                         dv + i0 * ldd, ldd);
      cpu_gemm::dense<F>(true, false, rows, head_dim, rows, scale, dp + i0, i1, q + i0 * ld, ld, F(0.0),
                         dk + i0 * ldd, ldd);
      cpu_gemm::dense<F>(false, false, rows, head_dim, i1, scale, dp, i1, k, ld, F(0.0), dq + i0 * ldd, ldd);
    }
  }

  // A product of two bf16 operands into float, on the calling thread (cpu_gemm's oneDNN path,
  // which needs no workspace).
  static void dot16(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, float alpha, const bf16* a,
                    index_t lda, const bf16* b, index_t ldb, float beta, float* c, index_t ldc) {
    cpu_gemm::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  // attention_fwd_head on bf16 dot products: q, k, v at offsets 0, d, 2d of rows with stride ld.
  // Slot: float scores (block, steps), then bf16 probabilities (block, steps), then from
  // 2·block·steps a block's float output (block, head_dim). The row sums are the float
  // probabilities'; the rounded ones meet V.
  template <class O, class St>
  static void attention_fwd_head_bf16(float* p, const bf16* q, index_t ld, O* out, index_t ldo, St* lse,
                                      index_t lse_ld, index_t steps, index_t head_dim, index_t d) {
    const bf16 *k = q + d, *v = q + 2 * d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const index_t block = attention_rows(steps), blocks = (steps + block - 1) / block;
    bf16* pb = reinterpret_cast<bf16*>(p + block * steps);
    float* of = p + 2 * block * steps;
    float inv[max_attention_rows];
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * block, i1 = std::min(steps, i0 + block), rows = i1 - i0;
      dot16(false, true, rows, i1, head_dim, scale, q + i0 * ld, ld, k, ld, 0.0f, p, i1);
      for (index_t i = i0; i < i1; ++i) {
        float* row = p + (i - i0) * i1;
        bf16* rb = pb + (i - i0) * i1;
        float mx = row[0];
#pragma omp simd reduction(max : mx)
        for (index_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (index_t j = 0; j <= i; ++j) {
          row[j] = cpu_detail::vexp(row[j] - mx);
          sum += row[j];
        }
#pragma omp simd
        for (index_t j = 0; j <= i; ++j) rb[j] = cpu_detail::cv<bf16>(row[j]);
        inv[i - i0] = 1.0f / sum;
        for (index_t j = i + 1; j < i1; ++j) rb[j] = bf16(0.0f);
        lse[i * lse_ld] = static_cast<St>(mx + std::log(sum));
      }
      dot16(false, false, rows, head_dim, i1, 1.0f, pb, i1, v, ld, 0.0f, of, head_dim);
      for (index_t r = 0; r < rows; ++r) {
        O* o = out + (i0 + r) * ldo;
        const float* f = of + r * head_dim;
        const float s = inv[r];
#pragma omp simd
        for (index_t c = 0; c < head_dim; ++c) o[c] = cpu_detail::cv<O>(f[c] * s);
      }
    }
  }

  // attention_bwd_head on bf16 dot products: q, k, v (offsets 0, d, 2d, stride ld) and dO
  // (stride ldo) read in place; dQ, dK, dV summed in float (the slot's staged room) and rounded
  // once into dq, dq + d, dq + 2d (stride ldd). P and dS are formed in float and rounded to bf16
  // to meet dO, Q and K.
  template <class DQ, class St>
  static void attention_bwd_head_bf16(float* p, const bf16* q, index_t ld, const bf16* dout, index_t ldo, DQ* dq,
                                      index_t ldd, const St* lse, index_t lse_ld, index_t steps, index_t head_dim,
                                      index_t d) {
    const bf16 *k = q + d, *v = q + 2 * d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const index_t block = attention_rows(steps), blocks = (steps + block - 1) / block, n = steps * head_dim;
    float* dp = p + block * steps;
    bf16* pb = reinterpret_cast<bf16*>(p + 2 * block * steps);
    bf16* sb = pb + block * steps;
    float *dqf = p + 3 * block * steps, *dkf = dqf + n, *dvf = dkf + n;
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * block, i1 = std::min(steps, i0 + block), rows = i1 - i0;
      dot16(false, true, rows, i1, head_dim, scale, q + i0 * ld, ld, k, ld, 0.0f, p, i1);
      dot16(false, true, rows, i1, head_dim, 1.0f, dout + i0 * ldo, ldo, v, ld, 0.0f, dp, i1);
      for (index_t i = i0; i < i1; ++i) {
        float* pr = p + (i - i0) * i1;
        float* dr = dp + (i - i0) * i1;
        bf16* prb = pb + (i - i0) * i1;
        bf16* srb = sb + (i - i0) * i1;
        const float l = static_cast<float>(lse[i * lse_ld]);
#pragma omp simd
        for (index_t j = 0; j <= i; ++j) pr[j] = cpu_detail::vexp(pr[j] - l);
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (index_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
#pragma omp simd
        for (index_t j = 0; j <= i; ++j) {
          prb[j] = cpu_detail::cv<bf16>(pr[j]);
          srb[j] = cpu_detail::cv<bf16>(pr[j] * (dr[j] - dot));
        }
        for (index_t j = i + 1; j < i1; ++j) prb[j] = srb[j] = bf16(0.0f);
      }
      if (i0 > 0) {
        dot16(true, false, i0, head_dim, rows, 1.0f, pb, i1, dout + i0 * ldo, ldo, 1.0f, dvf, head_dim);
        dot16(true, false, i0, head_dim, rows, scale, sb, i1, q + i0 * ld, ld, 1.0f, dkf, head_dim);
      }
      dot16(true, false, rows, head_dim, rows, 1.0f, pb + i0, i1, dout + i0 * ldo, ldo, 0.0f, dvf + i0 * head_dim,
            head_dim);
      dot16(true, false, rows, head_dim, rows, scale, sb + i0, i1, q + i0 * ld, ld, 0.0f, dkf + i0 * head_dim,
            head_dim);
      dot16(false, false, rows, head_dim, i1, scale, sb, i1, k, ld, 0.0f, dqf + i0 * head_dim, head_dim);
    }
    cpu_detail::narrow_head(dq, ldd, dqf, steps, head_dim);
    cpu_detail::narrow_head(dq + d, ldd, dkf, steps, head_dim);
    cpu_detail::narrow_head(dq + 2 * d, ldd, dvf, steps, head_dim);
  }
};

}  // namespace etude::backend
