// The CPU's causal self-attention (spec: ops/attention.hpp): per (sequence, head), query rows in
// blocks (detail/attention_blocks.hpp) against only the keys at or before the block's last row, each
// (sequence, head) on one thread; the backward recomputes the probabilities from q, k and lse.
// Here: the contract body (the portable heads, products through cpu_gemm::dense in the compute
// type, score rows by detail/score_rows.hpp) and the dispatch. Where the CPU has AVX512_BF16, float
// heads (own_float_attention()) and bf16 heads whose products cpu_gemm takes on the bf16
// dot-product instructions (bf16_dot_products()) run on etude's tile kernels instead
// (kernels/avx512_attention.hpp, in blocks of dot_rows): there bf16 probabilities and dS are
// rounded to bf16 (as the CUDA kernel rounds them) to meet V, dO, Q and K. Their bf16 products run
// on AMX tiles where the CPU has them (kernels/amx_tile_product.hpp), else on vdpbf16ps.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "etude/backend/cpu/detail/attention_blocks.hpp"
#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/head_slots.hpp"
#include "etude/backend/cpu/detail/score_rows.hpp"
#include "etude/backend/cpu/gemm.hpp"
#include "etude/backend/cpu/kernels/avx512_attention.hpp"
#include "etude/backend/cpu/kernels/avx512_tile_product.hpp"
#include "etude/backend/cpu/tuning.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_attention : cpu_detail::attention_blocks {
  // Causal multi-head self-attention over packed qkv (B·S, 3D) → att (B·S, D) and the
  // log-sum-exp of each score row, lse (B·S, H). Scores are 1/sqrt(hd)·q·k. Query rows go in
  // blocks (attention_blocks: attention_rows, dot_rows, score_stride). With 16-bit qkv each
  // (sequence, head) is widened into the thread's slot first and its results rounded once.
  using avx512_heads = cpu_detail::avx512_attention;  // the heads on etude's AVX-512 kernels

  // Scratch (in the compute type) attention_fwd/bwd need for sequences of `steps`: one slot per
  // thread; `staged` (16-bit tensors) adds room for one head's q, k, v, dO, dQ, dK, dV in float,
  // or for the dot path's paired operands (pair_room), whichever is larger.
  // Float tensors (not staged) add room for the float kernels' operands (float_room).
  static constexpr index_t attention_slot(index_t steps, index_t head_dim, bool staged) {
    return 2 * attention_rows(steps) * score_stride(steps) +
           (staged ? std::max(7 * steps * head_dim, avx512_heads::pair_room_floats(steps, head_dim))
                   : avx512_heads::float_room_floats(steps, head_dim));
  }
  static constexpr index_t attention_scratch(index_t steps, index_t head_dim, bool staged, int thread_count) {
    return static_cast<index_t>(thread_count) * attention_slot(steps, head_dim, staged);
  }

  // Whether float attention runs on etude's own kernels (tile_product' tiles on floats, the diagonal
  // blocks' masked corners left out) in this process: the CPU has their instructions and
  // set_own_float_attention(false) did not say no (for measuring and testing oneDNN's path, which
  // CPUs without them take). Double attention (the gradient checks' oracle) always takes dense.
  static bool own_float_attention() { return cpu_detail::tile_product::available() && own_float().load(); }
  static void set_own_float_attention(bool on) { own_float().store(on); }

  // The paths self-attention's products take in this process on this CPU, float tensors' then
  // bf16's, for run records.
  static std::string attention_products() {
    const std::string f = own_float_attention() ? "float on etude's AVX-512 kernels"
                                                : "float on cpu::gemm (" + cpu_gemm::float_products() + ")";
    return f + "; bf16 " + bf16_products_named();
  }

  // The head dimension is the model's, a compile-time value (ops/attention.hpp); the CPU's loops
  // take any.
  template <int HeadDim, class A, class Lse>
  static void attention_fwd(A* att, Lse* lse, const A* qkv, index_t batch, index_t steps, int heads,
                            cpu_detail::compute_of<A>* scratch, index_t scratch_size) {
    static_assert(HeadDim > 0, "cpu::attention_fwd: the head dimension must be positive");
    forward(att, lse, qkv, batch, steps, heads, HeadDim, scratch, scratch_size);
  }
  template <int HeadDim, class DQ, class A, class Lse>
  static void attention_bwd(DQ* dqkv, const A* datt, const A* att, const A* qkv, const Lse* lse, index_t batch,
                            index_t steps, int heads, cpu_detail::compute_of<A>* scratch, index_t scratch_size) {
    static_assert(HeadDim > 0, "cpu::attention_bwd: the head dimension must be positive");
    backward(dqkv, datt, att, qkv, lse, batch, steps, heads, HeadDim, scratch, scratch_size);
  }

 private:
  static std::atomic<bool>& own_float() {
    static std::atomic<bool> on{true};
    return on;
  }

  // The bf16 heads' path: AMX tiles, the dot-product instructions (and why not AMX, where the CPU
  // has it), or widened.
  static std::string bf16_products_named() {
    namespace isa = cpu_detail::isa;
    if (!bf16_dots()) return "widened to float";
    if (cpu_detail::tile_product::amx_tiles()) return "on etude's AMX tile kernels (tdpbf16ps; P and dS rounded to bf16)";
    const std::string dots = "on etude's AVX512_BF16 kernels (vdpbf16ps; P and dS rounded to bf16)";
    switch (isa::amx_bf16_state()) {
      case isa::amx_state::refused:
        return dots + "; the CPU has AMX but the kernel refused its tile state (arch_prctl)";
      case isa::amx_state::granted:
        return dots + "; AMX turned off (ETUDE_AMX=off or set_amx_tiles(false))";
      case isa::amx_state::absent:
        break;
    }
    return dots;
  }
  // Whether bf16 heads take the dot path: bf16 products on the CPU's dot-product instructions in
  // this process (cpu_gemm::bf16_dot_products(), which ETUDE_BF16_GEMM=widen turns off), etude's
  // own kernels for them (AVX512_BF16), and an even head dimension (pairs of it).
  static bool bf16_dots() { return cpu_gemm::bf16_dot_products() && cpu_detail::tile_product::available(); }
  static bool dot_products(index_t head_dim) { return head_dim % 2 == 0 && bf16_dots(); }

  template <class A, class Lse>
  static void forward(A* att, Lse* lse, const A* qkv, index_t batch, index_t steps, int heads, index_t head_dim,
                      cpu_detail::compute_of<A>* scratch, index_t scratch_size) {
    using Compute = cpu_detail::compute_of<A>;
    constexpr bool staged = !std::is_same_v<A, Compute>;
    const index_t d = heads * head_dim, ld = 3 * d, slot = attention_slot(steps, head_dim, staged);
    const int slots = cpu_detail::slot_count("cpu::attention_fwd", slot, scratch_size);
    const bool dot16 = std::is_same_v<A, bf16> && dot_products(head_dim);  // the same for every head
    const bool own32 = std::is_same_v<A, float> && own_float_attention();
#pragma omp parallel for schedule(static) num_threads(slots)
    for (index_t bh = 0; bh < batch * heads; ++bh) {
      const index_t b = bh / heads, h = bh % heads;
      Compute* p = scratch + omp_get_thread_num() * slot;
      const A* q = qkv + b * steps * ld + h * head_dim;
      A* out = att + b * steps * d + h * head_dim;
      Lse* l = lse + b * steps * heads + h;
      if constexpr (!staged) {
        if constexpr (std::is_same_v<A, float>) {
          if (own32) {
            avx512_heads::attention_fwd_head_f32(p, q, ld, out, d, l, heads, steps, head_dim, d);
            continue;
          }
        }
        attention_fwd_head(p, q, q + d, q + 2 * d, ld, out, d, l, heads, steps, head_dim);
      } else if (dot16) {
        if constexpr (std::is_same_v<A, bf16>)
          avx512_heads::attention_fwd_head_bf16(p, q, ld, out, d, l, heads, steps, head_dim, d);
      } else {
        Compute* qf = p + 2 * attention_rows(steps) * score_stride(steps);
        Compute* kf = qf + steps * head_dim;
        Compute* vf = kf + steps * head_dim;
        Compute* of = vf + steps * head_dim;
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
  template <class DQ, class A, class Lse>
  static void backward(DQ* dqkv, const A* datt, const A* /*att*/, const A* qkv, const Lse* lse, index_t batch,
                       index_t steps, int heads, index_t head_dim, cpu_detail::compute_of<A>* scratch,
                       index_t scratch_size) {
    using Compute = cpu_detail::compute_of<A>;
    constexpr bool staged = !std::is_same_v<A, Compute> || !std::is_same_v<DQ, Compute>;
    const index_t d = heads * head_dim, ld = 3 * d, slot = attention_slot(steps, head_dim, staged);
    const int slots = cpu_detail::slot_count("cpu::attention_bwd", slot, scratch_size);
    const bool dot16 = std::is_same_v<A, bf16> && dot_products(head_dim);  // the same for every head
    const bool own32 = std::is_same_v<A, float> && own_float_attention();
#pragma omp parallel for schedule(static) num_threads(slots)
    for (index_t bh = 0; bh < batch * heads; ++bh) {
      const index_t b = bh / heads, h = bh % heads;
      Compute* p = scratch + omp_get_thread_num() * slot;
      const A* q = qkv + b * steps * ld + h * head_dim;
      const A* dout = datt + b * steps * d + h * head_dim;
      DQ* dq = dqkv + b * steps * ld + h * head_dim;
      const Lse* l = lse + b * steps * heads + h;
      if constexpr (!staged) {
        if constexpr (std::is_same_v<A, float>) {
          if (own32) {
            avx512_heads::attention_bwd_head_f32(p, q, ld, dout, d, dq, ld, l, heads, steps, head_dim, d);
            continue;
          }
        }
        attention_bwd_head(p, q, q + d, q + 2 * d, ld, dout, d, dq, dq + d, dq + 2 * d, ld, l, heads, steps, head_dim);
      } else if (dot16) {
        if constexpr (std::is_same_v<A, bf16>)
          avx512_heads::attention_bwd_head_bf16(p, q, ld, dout, d, dq, ld, l, heads, steps, head_dim, d);
      } else {
        const index_t n = steps * head_dim;
        Compute* qf = p + 2 * attention_rows(steps) * score_stride(steps);
        Compute *kf = qf + n, *vf = kf + n, *of = vf + n, *dqf = of + n, *dkf = dqf + n, *dvf = dkf + n;
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
  template <class Compute, class O, class Lse>
  static void attention_fwd_head(Compute* p, const Compute* q, const Compute* k, const Compute* v, index_t ld, O* out,
                                 index_t ldo, Lse* lse, index_t lse_ld, index_t steps, index_t head_dim) {
    const Compute scale = Compute(1.0) / std::sqrt(static_cast<Compute>(head_dim));
    const index_t block = attention_rows(steps), blocks = (steps + block - 1) / block;
    Compute inv[max_attention_rows];
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * block, i1 = std::min(steps, i0 + block), rows = i1 - i0, lds = score_stride(i1);
      // scores (rows, i1) against keys 0 .. i1-1, row stride lds
      cpu_gemm::dense<Compute>(false, true, rows, i1, head_dim, scale, q + i0 * ld, ld, k, ld, Compute(0.0), p, lds);
      for (index_t i = i0; i < i1; ++i)
        lse[i * lse_ld] =
            static_cast<Lse>(cpu_detail::score_rows::softmax(p + (i - i0) * lds, nullptr, i + 1, i1, inv[i - i0]));
      cpu_gemm::dense<Compute>(false, false, rows, head_dim, i1, Compute(1.0), p, lds, v, ld, Compute(0.0),
                               out + i0 * ldo, ldo);
      for (index_t r = 0; r < rows; ++r) {
        O* o = out + (i0 + r) * ldo;
        const Compute s = inv[r];
#pragma omp simd
        for (index_t c = 0; c < head_dim; ++c) o[c] = o[c] * s;
      }
    }
  }

  template <class Compute, class Lse>
  static void attention_bwd_head(Compute* p, const Compute* q, const Compute* k, const Compute* v, index_t ld,
                                 const Compute* dout, index_t ldo, Compute* dq, Compute* dk, Compute* dv, index_t ldd,
                                 const Lse* lse, index_t lse_ld, index_t steps, index_t head_dim) {
    const Compute scale = Compute(1.0) / std::sqrt(static_cast<Compute>(head_dim));
    const index_t block = attention_rows(steps), blocks = (steps + block - 1) / block;
    Compute* dp = p + block * score_stride(steps);
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * block, i1 = std::min(steps, i0 + block), rows = i1 - i0, lds = score_stride(i1);
      cpu_gemm::dense<Compute>(false, true, rows, i1, head_dim, scale, q + i0 * ld, ld, k, ld, Compute(0.0), p, lds);
      cpu_gemm::dense<Compute>(false, true, rows, i1, head_dim, Compute(1.0), dout + i0 * ldo, ldo, v, ld, Compute(0.0),
                               dp, lds);
      for (index_t i = i0; i < i1; ++i) {
        Compute* dr = dp + (i - i0) * lds;
        cpu_detail::score_rows::backward(p + (i - i0) * lds, dr, dr, i + 1, i1, static_cast<Compute>(lse[i * lse_ld]));
      }
      // dV(0..i1) += Pᵀ dO, dK(0..i1) += scale·dSᵀ Q, dQ(block) = scale·dS K; rows at or past
      // i0 of dK and dV are first written by this block
      if (i0 > 0) {
        cpu_gemm::dense<Compute>(true, false, i0, head_dim, rows, Compute(1.0), p, lds, dout + i0 * ldo, ldo,
                                 Compute(1.0), dv, ldd);
        cpu_gemm::dense<Compute>(true, false, i0, head_dim, rows, scale, dp, lds, q + i0 * ld, ld, Compute(1.0), dk,
                                 ldd);
      }
      cpu_gemm::dense<Compute>(true, false, rows, head_dim, rows, Compute(1.0), p + i0, lds, dout + i0 * ldo, ldo,
                               Compute(0.0), dv + i0 * ldd, ldd);
      cpu_gemm::dense<Compute>(true, false, rows, head_dim, rows, scale, dp + i0, lds, q + i0 * ld, ld, Compute(0.0),
                               dk + i0 * ldd, ldd);
      cpu_gemm::dense<Compute>(false, false, rows, head_dim, i1, scale, dp, lds, k, ld, Compute(0.0), dq + i0 * ldd,
                               ldd);
    }
  }
};

}  // namespace etude::backend
