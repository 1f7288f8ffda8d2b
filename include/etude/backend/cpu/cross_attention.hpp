// The CPU's cross-attention (spec: ops/cross_attention.hpp): per (example, head), query rows in
// blocks against every condition position, the products through cpu_gemm::dense in the compute
// type, padded positions out of the softmax when a mask is given; the backward recomputes the
// probabilities from q, k and lse. bf16 q, k, v and dO meet each other on the CPU's bf16
// dot-product instructions where cpu_gemm has them (bf16_dot_products(): etude's own kernels, else
// oneDNN), as self-attention's do: scores and dP straight from the packed tensors, the
// probabilities and dS rounded to bf16 to meet V, dO, Q and K, dQ, dK and dV summed in float and
// rounded once.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/head_slots.hpp"
#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/backend/cpu/gemm.hpp"
#include "etude/backend/cpu/tuning.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_cross_attention {
  static constexpr index_t cross_rows = cpu_tuning<cpu_op::cross_attention>::rows;  // tuning.hpp

  // One slot per thread: scores and their gradient for a block of query rows, and with 16-bit
  // tensors one head's q, dO, dQ (S rows) and k, v, dK, dV (L rows) in the compute type, or a
  // block's bf16 probabilities and dS where those meet the bf16 dot products.
  static constexpr index_t cross_attention_slot(index_t steps, index_t positions, index_t head_dim, bool staged) {
    return 2 * cross_rows * positions +
           (staged ? 3 * steps * head_dim + 4 * positions * head_dim + cross_rows * positions : 0);
  }
  static constexpr index_t cross_attention_scratch(index_t steps, index_t positions, index_t head_dim, bool staged,
                                                   int thread_count) {
    return static_cast<index_t>(thread_count) * cross_attention_slot(steps, positions, head_dim, staged);
  }

  template <int HeadDim, class A, class Lse, class M>
  static void cross_attention_fwd(A* att, Lse* lse, const A* q, const A* kv, const M* mask, index_t batch,
                                  index_t steps, index_t positions, int heads, index_t ldq,
                                  cpu_detail::compute_of<A>* scratch, index_t scratch_size) {
    using Compute = cpu_detail::compute_of<A>;
    constexpr bool staged = !std::is_same_v<A, Compute>;
    constexpr index_t hd = HeadDim;
    const index_t d = heads * hd, slot = cross_attention_slot(steps, positions, hd, staged);
    const int slots = cpu_detail::slot_count("cpu::cross_attention_fwd", slot, scratch_size);
    const bool dot16 = std::is_same_v<A, bf16> && cpu_gemm::bf16_dot_products();  // the same for every head
#pragma omp parallel for schedule(static) num_threads(slots)
    for (index_t bh = 0; bh < batch * heads; ++bh) {
      const index_t b = bh / heads, h = bh % heads;
      Compute* p = scratch + omp_get_thread_num() * slot;
      const A* qh = q + b * steps * ldq + h * hd;
      const A* kh = kv + b * positions * 2 * d + h * hd;
      const M* m = mask != nullptr ? mask + b * positions : nullptr;
      A* out = att + b * steps * d + h * hd;
      Lse* l = lse + b * steps * heads + h;
      if constexpr (!staged) {
        fwd_head(p, qh, ldq, kh, kh + d, 2 * d, m, out, d, l, heads, steps, positions, hd);
      } else if (dot16) {
        if constexpr (std::is_same_v<A, bf16>)
          fwd_head_bf16(p, qh, ldq, kh, kh + d, 2 * d, m, out, d, l, heads, steps, positions, hd);
      } else {
        Compute* qf = p + 2 * cross_rows * positions;
        Compute* of = qf + steps * hd;
        Compute* kf = of + 2 * steps * hd;
        Compute* vf = kf + positions * hd;
        cpu_detail::widen_head(qf, qh, ldq, steps, hd);
        cpu_detail::widen_head(kf, kh, 2 * d, positions, hd);
        cpu_detail::widen_head(vf, kh + d, 2 * d, positions, hd);
        fwd_head(p, qf, hd, kf, vf, hd, m, of, hd, l, heads, steps, positions, hd);
        cpu_detail::narrow_head(out, d, of, steps, hd);
      }
    }
  }

  template <int HeadDim, class DQ, class A, class Lse, class M>
  static void cross_attention_bwd(DQ* dq, DQ* dkv, const A* datt, const A* q, const A* kv, const Lse* lse,
                                  const M* mask, index_t batch, index_t steps, index_t positions, int heads,
                                  index_t ldq, cpu_detail::compute_of<A>* scratch, index_t scratch_size) {
    using Compute = cpu_detail::compute_of<A>;
    constexpr bool staged = !std::is_same_v<A, Compute> || !std::is_same_v<DQ, Compute>;
    constexpr index_t hd = HeadDim;
    const index_t d = heads * hd, slot = cross_attention_slot(steps, positions, hd, staged);
    const int slots = cpu_detail::slot_count("cpu::cross_attention_bwd", slot, scratch_size);
    const bool dot16 = std::is_same_v<A, bf16> && cpu_gemm::bf16_dot_products();  // the same for every head
#pragma omp parallel for schedule(static) num_threads(slots)
    for (index_t bh = 0; bh < batch * heads; ++bh) {
      const index_t b = bh / heads, h = bh % heads;
      Compute* p = scratch + omp_get_thread_num() * slot;
      const A* qh = q + b * steps * ldq + h * hd;
      const A* kh = kv + b * positions * 2 * d + h * hd;
      const A* dout = datt + b * steps * d + h * hd;
      DQ* dqh = dq + b * steps * ldq + h * hd;
      DQ* dkh = dkv + b * positions * 2 * d + h * hd;
      const M* m = mask != nullptr ? mask + b * positions : nullptr;
      const Lse* l = lse + b * steps * heads + h;
      if constexpr (!staged) {
        bwd_head(p, qh, ldq, kh, kh + d, 2 * d, dout, d, dqh, ldq, dkh, dkh + d, 2 * d, m, l, heads, steps, positions, hd);
      } else if (dot16) {
        if constexpr (std::is_same_v<A, bf16>)
          bwd_head_bf16(p, qh, ldq, kh, kh + d, 2 * d, dout, d, dqh, ldq, dkh, dkh + d, 2 * d, m, l, heads, steps,
                        positions, hd);
      } else {
        Compute* qf = p + 2 * cross_rows * positions;
        Compute* of = qf + steps * hd;
        Compute* dqf = of + steps * hd;
        Compute* kf = dqf + steps * hd;
        Compute* vf = kf + positions * hd;
        Compute* dkf = vf + positions * hd;
        Compute* dvf = dkf + positions * hd;
        cpu_detail::widen_head(qf, qh, ldq, steps, hd);
        cpu_detail::widen_head(of, dout, d, steps, hd);
        cpu_detail::widen_head(kf, kh, 2 * d, positions, hd);
        cpu_detail::widen_head(vf, kh + d, 2 * d, positions, hd);
        bwd_head(p, qf, hd, kf, vf, hd, of, hd, dqf, hd, dkf, dvf, hd, m, l, heads, steps, positions, hd);
        cpu_detail::narrow_head(dqh, ldq, dqf, steps, hd);
        cpu_detail::narrow_head(dkh, 2 * d, dkf, positions, hd);
        cpu_detail::narrow_head(dkh + d, 2 * d, dvf, positions, hd);
      }
    }
  }

 private:
  template <class M>
  static bool valid(const M* m, index_t j) {
    return m == nullptr || m[j] != M(0);
  }

  // One head of one example: q rows with stride ldq, k and v rows with stride ldk, out with ldo.
  template <class Compute, class O, class Lse, class M>
  static void fwd_head(Compute* p, const Compute* q, index_t ldq, const Compute* k, const Compute* v, index_t ldk,
                       const M* m, O* out, index_t ldo, Lse* lse, index_t lse_ld, index_t steps, index_t positions,
                       index_t hd) {
    const Compute scale = Compute(1.0) / std::sqrt(static_cast<Compute>(hd));
    const index_t n = positions;
    for (index_t i0 = 0; i0 < steps; i0 += cross_rows) {
      const index_t rows = std::min(cross_rows, steps - i0);
      cpu_gemm::dense<Compute>(false, true, rows, n, hd, scale, q + i0 * ldq, ldq, k, ldk, Compute(0.0), p, n);
      for (index_t i = 0; i < rows; ++i) {
        Compute* row = p + i * n;
        Compute mx = -std::numeric_limits<Compute>::infinity();
        for (index_t j = 0; j < n; ++j)
          if (valid(m, j)) mx = std::max(mx, row[j]);
        if (mx == -std::numeric_limits<Compute>::infinity()) {  // no valid position: nothing to attend to
          for (index_t j = 0; j < n; ++j) row[j] = Compute(0.0);
          lse[(i0 + i) * lse_ld] = static_cast<Lse>(std::numeric_limits<Compute>::infinity());
          continue;
        }
        Compute sum = Compute(0.0);
        for (index_t j = 0; j < n; ++j) {
          row[j] = valid(m, j) ? cpu_detail::vexp(row[j] - mx) : Compute(0.0);
          sum += row[j];
        }
        const Compute inv = Compute(1.0) / sum;
        for (index_t j = 0; j < n; ++j) row[j] *= inv;
        lse[(i0 + i) * lse_ld] = static_cast<Lse>(mx + std::log(sum));
      }
      cpu_gemm::dense<Compute>(false, false, rows, hd, n, Compute(1.0), p, n, v, ldk, Compute(0.0), out + i0 * ldo,
                               ldo);
    }
  }

  template <class Compute, class Lse, class M>
  static void bwd_head(Compute* p, const Compute* q, index_t ldq, const Compute* k, const Compute* v, index_t ldk,
                       const Compute* dout, index_t ldo, Compute* dq, index_t lddq, Compute* dk, Compute* dv,
                       index_t lddk, const M* m, const Lse* lse, index_t lse_ld, index_t steps, index_t positions,
                       index_t hd) {
    const Compute scale = Compute(1.0) / std::sqrt(static_cast<Compute>(hd));
    const index_t n = positions;
    Compute* dp = p + cross_rows * n;
    for (index_t i0 = 0; i0 < steps; i0 += cross_rows) {
      const index_t rows = std::min(cross_rows, steps - i0);
      cpu_gemm::dense<Compute>(false, true, rows, n, hd, scale, q + i0 * ldq, ldq, k, ldk, Compute(0.0), p, n);
      cpu_gemm::dense<Compute>(false, true, rows, n, hd, Compute(1.0), dout + i0 * ldo, ldo, v, ldk, Compute(0.0), dp,
                               n);
      for (index_t i = 0; i < rows; ++i) {
        Compute* pr = p + i * n;
        Compute* dr = dp + i * n;
        const Compute l = static_cast<Compute>(lse[(i0 + i) * lse_ld]);
        const bool none = l == std::numeric_limits<Compute>::infinity();
        for (index_t j = 0; j < n; ++j) pr[j] = !none && valid(m, j) ? cpu_detail::vexp(pr[j] - l) : Compute(0.0);
        Compute dot = Compute(0.0);
        for (index_t j = 0; j < n; ++j) dot += pr[j] * dr[j];
        for (index_t j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - dot);
      }
      // dV += Pᵀ dO, dK += scale·dSᵀ Q over the blocks (the first block writes), dQ = scale·dS K
      const Compute beta = i0 == 0 ? Compute(0.0) : Compute(1.0);
      cpu_gemm::dense<Compute>(true, false, n, hd, rows, Compute(1.0), p, n, dout + i0 * ldo, ldo, beta, dv, lddk);
      cpu_gemm::dense<Compute>(true, false, n, hd, rows, scale, dp, n, q + i0 * ldq, ldq, beta, dk, lddk);
      cpu_gemm::dense<Compute>(false, false, rows, hd, n, scale, dp, n, k, ldk, Compute(0.0), dq + i0 * lddq, lddq);
    }
    if (steps == 0)
      for (index_t j = 0; j < n; ++j)
        for (index_t c = 0; c < hd; ++c) dk[j * lddk + c] = dv[j * lddk + c] = Compute(0.0);
  }

  // fwd_head on bf16 dot products: q, k, v read in place. Slot: float scores (cross_rows,
  // positions); from 2·cross_rows·positions the block's bf16 probabilities, then its float output
  // (cross_rows, hd). The rows are normalised in float, then rounded to meet V.
  template <class O, class Lse, class M>
  static void fwd_head_bf16(float* p, const bf16* q, index_t ldq, const bf16* k, const bf16* v, index_t ldk, const M* m,
                            O* out, index_t ldo, Lse* lse, index_t lse_ld, index_t steps, index_t positions,
                            index_t hd) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const index_t n = positions;
    bf16* pb = reinterpret_cast<bf16*>(p + 2 * cross_rows * n);
    float* of = p + 3 * cross_rows * n;
    for (index_t i0 = 0; i0 < steps; i0 += cross_rows) {
      const index_t rows = std::min(cross_rows, steps - i0);
      cpu_gemm::gemm(false, true, rows, n, hd, scale, q + i0 * ldq, ldq, k, ldk, 0.0, p, n);
      for (index_t i = 0; i < rows; ++i) {
        float* row = p + i * n;
        bf16* rb = pb + i * n;
        float mx = -std::numeric_limits<float>::infinity();
        for (index_t j = 0; j < n; ++j)
          if (valid(m, j)) mx = std::max(mx, row[j]);
        if (mx == -std::numeric_limits<float>::infinity()) {  // no valid position: nothing to attend to
          for (index_t j = 0; j < n; ++j) rb[j] = bf16(0.0f);
          lse[(i0 + i) * lse_ld] = static_cast<Lse>(std::numeric_limits<float>::infinity());
          continue;
        }
        float sum = 0.0f;
        for (index_t j = 0; j < n; ++j) {
          row[j] = valid(m, j) ? cpu_detail::vexp(row[j] - mx) : 0.0f;
          sum += row[j];
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (index_t j = 0; j < n; ++j) rb[j] = cpu_detail::convert<bf16>(row[j] * inv);
        lse[(i0 + i) * lse_ld] = static_cast<Lse>(mx + std::log(sum));
      }
      cpu_gemm::gemm(false, false, rows, hd, n, 1.0, pb, n, v, ldk, 0.0, of, hd);
      cpu_detail::narrow_head(out + i0 * ldo, ldo, of, rows, hd);
    }
  }

  // bwd_head on bf16 dot products: q, k, v and dO read in place; dQ, dK and dV summed in float
  // (the slot's staged room: the block's bf16 P and dS from 2·cross_rows·positions, then dQ (S
  // rows), dK and dV (L rows)) and rounded once.
  template <class DQ, class Lse, class M>
  static void bwd_head_bf16(float* p, const bf16* q, index_t ldq, const bf16* k, const bf16* v, index_t ldk,
                            const bf16* dout, index_t ldo, DQ* dq, index_t lddq, DQ* dk, DQ* dv, index_t lddk,
                            const M* m, const Lse* lse, index_t lse_ld, index_t steps, index_t positions, index_t hd) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const index_t n = positions;
    float* dp = p + cross_rows * n;
    bf16* pb = reinterpret_cast<bf16*>(p + 2 * cross_rows * n);
    bf16* sb = pb + cross_rows * n;
    float* dqf = p + 3 * cross_rows * n;
    float *dkf = dqf + steps * hd, *dvf = dkf + n * hd;
    for (index_t i0 = 0; i0 < steps; i0 += cross_rows) {
      const index_t rows = std::min(cross_rows, steps - i0);
      cpu_gemm::gemm(false, true, rows, n, hd, scale, q + i0 * ldq, ldq, k, ldk, 0.0, p, n);
      cpu_gemm::gemm(false, true, rows, n, hd, 1.0, dout + i0 * ldo, ldo, v, ldk, 0.0, dp, n);
      for (index_t i = 0; i < rows; ++i) {
        float* pr = p + i * n;
        float* dr = dp + i * n;
        const float l = static_cast<float>(lse[(i0 + i) * lse_ld]);
        const bool none = l == std::numeric_limits<float>::infinity();
        for (index_t j = 0; j < n; ++j) pr[j] = !none && valid(m, j) ? cpu_detail::vexp(pr[j] - l) : 0.0f;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (index_t j = 0; j < n; ++j) dot += pr[j] * dr[j];
        bf16* prb = pb + i * n;
        bf16* srb = sb + i * n;
#pragma omp simd
        for (index_t j = 0; j < n; ++j) {
          prb[j] = cpu_detail::convert<bf16>(pr[j]);
          srb[j] = cpu_detail::convert<bf16>(pr[j] * (dr[j] - dot));
        }
      }
      // dV += Pᵀ dO, dK += scale·dSᵀ Q over the blocks (the first block writes), dQ = scale·dS K
      const double beta = i0 == 0 ? 0.0 : 1.0;
      cpu_gemm::gemm(true, false, n, hd, rows, 1.0, pb, n, dout + i0 * ldo, ldo, beta, dvf, hd);
      cpu_gemm::gemm(true, false, n, hd, rows, static_cast<double>(scale), sb, n, q + i0 * ldq, ldq, beta, dkf, hd);
      cpu_gemm::gemm(false, false, rows, hd, n, static_cast<double>(scale), sb, n, k, ldk, 0.0, dqf + i0 * hd, hd);
    }
    if (steps == 0)
      for (index_t j = 0; j < n * hd; ++j) dkf[j] = dvf[j] = 0.0f;
    cpu_detail::narrow_head(dq, lddq, dqf, steps, hd);
    cpu_detail::narrow_head(dk, lddk, dkf, n, hd);
    cpu_detail::narrow_head(dv, lddk, dvf, n, hd);
  }
};

}  // namespace etude::backend
