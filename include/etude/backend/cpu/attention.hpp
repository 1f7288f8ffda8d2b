// The CPU's causal self-attention (spec: ops/attention.hpp): per (sequence, head), query rows in
// blocks against only the keys at or before the block's last row, the products through
// cpu_gemm::dense in the compute type, each (sequence, head) on one thread; the backward
// recomputes the probabilities from q, k and lse.
// Long sequences take blocks of 128 rows: the products are most of the time, and taller blocks
// run them faster once a row's keys outnumber the masked corner a tall diagonal block wastes.
// Measured on 2 AVX-512 cores (head dim 64, step_bench tiny_long --profile, T=2048, forward and
// backward ms per step): fp32 on oneDNN 72 and 152 with 64 or 128 rows alike (since the score rows'
// kernels, 52–57 and 133–139 with 128 against 54–56 and 153–155 with 64); bf16 on oneDNN's dot
// products 48 and 86 with 128 rows, 54 and 101 with 64. bf16 on etude's own kernels keeps 64 rows
// at every length: 29.2–29.5 and 66.1–67.7 against 30.4–31.2 and 69.2–69.6 with 128 (3
// interleaved rounds each), a 128-row block's scores and dP (1 MiB each at T=2048) outgrowing L2.
// The score rows (the softmax, and the backward's P and dS) run on kernels/avx512_score_rows.hpp's AVX-512
// kernels where the CPU has AVX-512F.
// bf16 q, k, v and dO meet each other on the CPU's bf16 dot-product instructions where cpu_gemm
// multiplies bf16 on them (bf16_dot_products()) and the CPU has AVX512_BF16: etude's own kernels
// (kernels/avx512_tile_product.hpp) on operands paired once per head, scores and dP from q and dO in place,
// the probabilities and dS rounded to bf16 (as the CUDA kernel rounds them) to meet V, dO, Q and K.
// There the diagonal block's products leave out its masked corner (tile_product::causal): scores past
// a row's last key by vectors of 16, and the pairs of zero probabilities or dS by tiles of 6 rows,
// with the same bits (tiny bf16's attention 17.7 → 15.8 ms a step at T=256, 64-row blocks). P and
// dS are rounded two vectors at a time, the backward's two rows at once straight into the paired
// words (score_rows::paired; tiny_long bf16's attention 90.5–96.4 → 87.5–90.3 ms a step).
// Float q, k, v and dO take the same kernels on floats (vfmadd231ps) where the CPU has them
// (own_float_attention()), in blocks of dot_rows with the same corners left out, instead of
// oneDNN's products: per step (--profile, quiet) tiny fp32's attention 32 → 26 ms, small's 229 →
// 202, tiny_long's 174 → 166. oneDNN's path above stays for other CPUs.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "etude/backend/cpu/kernels/avx512_tile_product.hpp"
#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/head_slots.hpp"
#include "etude/backend/cpu/detail/score_rows.hpp"
#include "etude/backend/cpu/gemm.hpp"
#include "etude/backend/cpu/tuning.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_attention {
  // Causal multi-head self-attention over packed qkv (B·S, 3D) → att (B·S, D) and the
  // log-sum-exp of each score row, lse (B·S, H). Scores are 1/sqrt(hd)·q·k. Query rows go in
  // blocks of `attention_rows(S)`; a block only meets the keys at or before its last row, so the
  // masked upper triangle is never computed (beyond the diagonal blocks). With 16-bit qkv each
  // (sequence, head) is widened into the thread's slot first and its results rounded once.
  using tuning = cpu_tuning<cpu_op::attention>;  // tuning.hpp
  static constexpr index_t max_attention_rows = tuning::max_rows;
  static constexpr index_t attention_rows(index_t steps) {
    return steps > tuning::long_steps ? max_attention_rows : tuning::rows;
  }
  // The AVX-512 kernels' blocks (at most attention_rows(steps), which sizes the scratch).
  static constexpr index_t dot_rows = cpu_tuning<cpu_op::attention, void, 0, cpu_isa::avx512_bf16>::dot_rows;
  static_assert(tuning::rows <= max_attention_rows && dot_rows <= tuning::rows,
                "cpu_tuning<cpu_op::attention>: rows and dot_rows must not exceed max_rows and rows");

  // Score rows hold whole vectors of 16 (the row loops never take a scalar remainder).
  static constexpr index_t score_stride(index_t keys) { return cpu_detail::tile_product::padded(keys); }

  // Scratch (in the compute type) attention_fwd/bwd need for sequences of `steps`: one slot per
  // thread; `staged` (16-bit tensors) adds room for one head's q, k, v, dO, dQ, dK, dV in float,
  // or for the dot path's paired operands (pair_room), whichever is larger.
  // Float tensors (not staged) add room for the float kernels' operands (float_room).
  static constexpr index_t attention_slot(index_t steps, index_t head_dim, bool staged) {
    return 2 * attention_rows(steps) * score_stride(steps) +
           (staged ? std::max(7 * steps * head_dim, pair_room_floats(steps, head_dim))
                   : float_room_floats(steps, head_dim));
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
    return f + "; bf16 " + (bf16_dots() ? "on etude's AVX512_BF16 kernels (P and dS rounded to bf16)" : "widened to float");
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
            attention_fwd_head_f32(p, q, ld, out, d, l, heads, steps, head_dim, d);
            continue;
          }
        }
        attention_fwd_head(p, q, q + d, q + 2 * d, ld, out, d, l, heads, steps, head_dim);
      } else if (dot16) {
        if constexpr (std::is_same_v<A, bf16>) attention_fwd_head_bf16(p, q, ld, out, d, l, heads, steps, head_dim, d);
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
            attention_bwd_head_f32(p, q, ld, dout, d, dq, ld, l, heads, steps, head_dim, d);
            continue;
          }
        }
        attention_bwd_head(p, q, q + d, q + 2 * d, ld, dout, d, dq, dq + d, dq + 2 * d, ld, l, heads, steps, head_dim);
      } else if (dot16) {
        if constexpr (std::is_same_v<A, bf16>)
          attention_bwd_head_bf16(p, q, ld, dout, d, dq, ld, l, heads, steps, head_dim, d);
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
  static void attention_fwd_head(Compute* p, const Compute* q, const Compute* k, const Compute* v, index_t ld, O* out, index_t ldo, Lse* lse,
                                 index_t lse_ld, index_t steps, index_t head_dim) {
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
      cpu_gemm::dense<Compute>(false, false, rows, head_dim, i1, Compute(1.0), p, lds, v, ld, Compute(0.0), out + i0 * ldo, ldo);
      for (index_t r = 0; r < rows; ++r) {
        O* o = out + (i0 + r) * ldo;
        const Compute s = inv[r];
#pragma omp simd
        for (index_t c = 0; c < head_dim; ++c) o[c] = o[c] * s;
      }
    }
  }

  template <class Compute, class Lse>
  static void attention_bwd_head(Compute* p, const Compute* q, const Compute* k, const Compute* v, index_t ld, const Compute* dout, index_t ldo,
                                 Compute* dq, Compute* dk, Compute* dv, index_t ldd, const Lse* lse, index_t lse_ld, index_t steps,
                                 index_t head_dim) {
    const Compute scale = Compute(1.0) / std::sqrt(static_cast<Compute>(head_dim));
    const index_t block = attention_rows(steps), blocks = (steps + block - 1) / block;
    Compute* dp = p + block * score_stride(steps);
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * block, i1 = std::min(steps, i0 + block), rows = i1 - i0, lds = score_stride(i1);
      cpu_gemm::dense<Compute>(false, true, rows, i1, head_dim, scale, q + i0 * ld, ld, k, ld, Compute(0.0), p, lds);
      cpu_gemm::dense<Compute>(false, true, rows, i1, head_dim, Compute(1.0), dout + i0 * ldo, ldo, v, ld, Compute(0.0), dp, lds);
      for (index_t i = i0; i < i1; ++i) {
        Compute* dr = dp + (i - i0) * lds;
        cpu_detail::score_rows::backward(p + (i - i0) * lds, dr, dr, i + 1, i1, static_cast<Compute>(lse[i * lse_ld]));
      }
      // dV(0..i1) += Pᵀ dO, dK(0..i1) += scale·dSᵀ Q, dQ(block) = scale·dS K; rows at or past
      // i0 of dK and dV are first written by this block
      if (i0 > 0) {
        cpu_gemm::dense<Compute>(true, false, i0, head_dim, rows, Compute(1.0), p, lds, dout + i0 * ldo, ldo, Compute(1.0), dv, ldd);
        cpu_gemm::dense<Compute>(true, false, i0, head_dim, rows, scale, dp, lds, q + i0 * ld, ld, Compute(1.0), dk, ldd);
      }
      cpu_gemm::dense<Compute>(true, false, rows, head_dim, rows, Compute(1.0), p + i0, lds, dout + i0 * ldo, ldo, Compute(0.0),
                         dv + i0 * ldd, ldd);
      cpu_gemm::dense<Compute>(true, false, rows, head_dim, rows, scale, dp + i0, lds, q + i0 * ld, ld, Compute(0.0),
                         dk + i0 * ldd, ldd);
      cpu_gemm::dense<Compute>(false, false, rows, head_dim, i1, scale, dp, lds, k, ld, Compute(0.0), dq + i0 * ldd, ldd);
    }
  }

  // A room of pieces of the given sizes (floats) in a slot, each starting on a 64-byte line: the
  // floats it needs (each piece may start up to a line past where the previous one ended), and
  // where the pieces start from `at`. One list of sizes serves the slot's size and its carving.
  template <std::size_t N>
  static constexpr index_t line_room(const std::array<index_t, N>& sizes) {
    index_t total = 0;
    for (const index_t n : sizes) total += n + cpu_detail::tile_product::lanes;
    return total;
  }
  template <std::size_t N>
  static std::array<float*, N> line_pieces(float* at, const std::array<index_t, N>& sizes) {
    std::array<float*, N> piece{};
    for (std::size_t i = 0; i < N; ++i) {
      const auto misplaced = static_cast<index_t>(reinterpret_cast<std::uintptr_t>(at) % 64 / sizeof(float));
      piece[i] = at + (misplaced == 0 ? 0 : cpu_detail::tile_product::lanes - misplaced);
      at = piece[i] + sizes[i];
    }
    return piece;
  }

  // The float kernels' room in a slot, past the scores and dP (2·attention_rows·score_stride(steps)):
  // K and V transposed (head_dim × padded steps each), and K, Q and dO (V in the forward) in rows
  // of padded(head_dim), zero past head_dim (steps each).
  struct float_room {
    float *kt, *vt, *kr, *qr, *dor;
  };
  static constexpr std::array<index_t, 5> float_pieces(index_t steps, index_t head_dim) {
    namespace pairs = cpu_detail::tile_product;
    const index_t across = head_dim * pairs::padded(steps), along = steps * pairs::padded(head_dim);
    return {across, across, along, along, along};
  }
  static constexpr index_t float_room_floats(index_t steps, index_t head_dim) {
    return line_room(float_pieces(steps, head_dim));
  }
  static float_room carve_floats(float* at, index_t steps, index_t head_dim) {
    const auto piece = line_pieces(at, float_pieces(steps, head_dim));
    return {piece[0], piece[1], piece[2], piece[3], piece[4]};
  }
  // x (rows × cols, stride ld) into dst transposed (cols × ldd, zero from rows to ldd), or in rows of
  // ldd (zero from cols to ldd).
  static void transpose_into(float* dst, index_t ldd, const float* x, index_t ld, index_t rows, index_t cols) {
    for (index_t c = 0; c < cols; ++c) {
      float* d = dst + c * ldd;
#pragma omp simd
      for (index_t r = 0; r < rows; ++r) d[r] = x[r * ld + c];
      std::fill(d + rows, d + ldd, 0.0f);
    }
  }
  static void rows_into(float* dst, index_t ldd, const float* x, index_t ld, index_t rows, index_t cols) {
    for (index_t r = 0; r < rows; ++r) {
      std::copy(x + r * ld, x + r * ld + cols, dst + r * ldd);
      std::fill(dst + r * ldd + cols, dst + (r + 1) * ldd, 0.0f);
    }
  }

  // attention_fwd_head on etude's float kernels: q, k, v at offsets 0, d, 2d of rows with stride ld;
  // K transposed and V in padded rows once for the head; blocks of dot_rows query rows, scores and
  // the output from the kernels with the diagonal block's masked corner left out.
  template <class Lse>
  static void attention_fwd_head_f32(float* p, const float* q, index_t ld, float* out, index_t ldo, Lse* lse,
                                     index_t lse_ld, index_t steps, index_t head_dim, index_t d) {
    namespace pairs = cpu_detail::tile_product;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const index_t block = dot_rows, blocks = (steps + block - 1) / block;
    const index_t ldt = pairs::padded(steps), ldr = pairs::padded(head_dim);
    const float_room room = carve_floats(p + 2 * attention_rows(steps) * score_stride(steps), steps, head_dim);
    float* vr = room.dor;  // V in rows: dO's piece, which the forward does not use
    transpose_into(room.kt, ldt, q + d, ld, steps, head_dim);
    rows_into(vr, ldr, q + 2 * d, ld, steps, head_dim);
    float inv[max_attention_rows];
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * block, i1 = std::min(steps, i0 + block), rows = i1 - i0, lds = score_stride(i1);
      pairs::product(rows, i1, head_dim, scale, q + i0 * ld, ld, 1, room.kt, ldt, 0.0f, p, lds,
                     causal{causal::columns_to_row, i0});
      for (index_t r = 0; r < rows; ++r)
        lse[(i0 + r) * lse_ld] =
            static_cast<Lse>(cpu_detail::score_rows::softmax(p + r * lds, nullptr, i0 + r + 1, i1, inv[r]));
      pairs::product(rows, head_dim, i1, 1.0f, p, lds, 1, vr, ldr, 0.0f, out + i0 * ldo, ldo,
                     causal{causal::reduction_to_row, i0});
      for (index_t r = 0; r < rows; ++r) {
        float* o = out + (i0 + r) * ldo;
        const float s = inv[r];
#pragma omp simd
        for (index_t c = 0; c < head_dim; ++c) o[c] *= s;
      }
    }
  }

  // attention_bwd_head on etude's float kernels: K and V transposed, K, Q and dO in padded rows once
  // for the head; dS in place over dP; dK and dV accumulate over the blocks in dk = dq + d and
  // dv = dq + 2d (stride ldd), as attention_bwd_head does.
  template <class Lse>
  static void attention_bwd_head_f32(float* p, const float* q, index_t ld, const float* dout, index_t ldo, float* dq,
                                     index_t ldd, const Lse* lse, index_t lse_ld, index_t steps, index_t head_dim,
                                     index_t d) {
    namespace pairs = cpu_detail::tile_product;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const index_t block = dot_rows, blocks = (steps + block - 1) / block;
    const index_t ldt = pairs::padded(steps), ldr = pairs::padded(head_dim);
    float* dp = p + attention_rows(steps) * score_stride(steps);
    const float_room room = carve_floats(p + 2 * attention_rows(steps) * score_stride(steps), steps, head_dim);
    transpose_into(room.kt, ldt, q + d, ld, steps, head_dim);
    transpose_into(room.vt, ldt, q + 2 * d, ld, steps, head_dim);
    rows_into(room.kr, ldr, q + d, ld, steps, head_dim);
    rows_into(room.qr, ldr, q, ld, steps, head_dim);
    rows_into(room.dor, ldr, dout, ldo, steps, head_dim);
    float *dk = dq + d, *dv = dq + 2 * d;
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * block, i1 = std::min(steps, i0 + block), rows = i1 - i0, lds = score_stride(i1);
      const causal upto_key{causal::columns_to_row, i0};
      pairs::product(rows, i1, head_dim, scale, q + i0 * ld, ld, 1, room.kt, ldt, 0.0f, p, lds, upto_key);
      pairs::product(rows, i1, head_dim, 1.0f, dout + i0 * ldo, ldo, 1, room.vt, ldt, 0.0f, dp, lds, upto_key);
      for (index_t i = i0; i < i1; ++i) {
        float* dr = dp + (i - i0) * lds;
        cpu_detail::score_rows::backward(p + (i - i0) * lds, dr, dr, i + 1, i1, static_cast<float>(lse[i * lse_ld]));
      }
      // dV(0..i1) += Pᵀ dO, dK(0..i1) += scale·dSᵀ Q, dQ(block) = scale·dS K; rows at or past i0
      // of dK and dV are first written by this block
      const float *dob = room.dor + i0 * ldr, *qb = room.qr + i0 * ldr;
      if (i0 > 0) {
        pairs::product(i0, head_dim, rows, 1.0f, p, 1, lds, dob, ldr, 1.0f, dv, ldd);
        pairs::product(i0, head_dim, rows, scale, dp, 1, lds, qb, ldr, 1.0f, dk, ldd);
      }
      const causal from_query{causal::reduction_from_row, 0};  // key i0 + r meets queries i0 + r on
      pairs::product(rows, head_dim, rows, 1.0f, p + i0, 1, lds, dob, ldr, 0.0f, dv + i0 * ldd, ldd, from_query);
      pairs::product(rows, head_dim, rows, scale, dp + i0, 1, lds, qb, ldr, 0.0f, dk + i0 * ldd, ldd, from_query);
      pairs::product(rows, head_dim, i1, scale, dp, lds, 1, room.kr, ldr, 0.0f, dq + i0 * ldd, ldd,
                     causal{causal::reduction_to_row, i0});
    }
  }

  // The dot path's room in a slot, past the float scores and dP (2·block·score_stride(steps)): P
  // or dS in bf16 rows (block × score_stride(steps)), P and dS with rows paired (block/2 × steps words each), K and V
  // paired along the head dimension (head_dim/2 × padded steps words each), K, Q and dO (V in the
  // forward) with rows paired (steps/2 × padded head_dim words each), and dQ, dK, dV in float
  // (the forward's output block uses dQ's). Each piece starts on a 64-byte line.
  using pair_word = cpu_detail::tile_product::word;
  using causal = cpu_detail::tile_product::causal;
  struct pair_room {
    bf16* rows;
    pair_word *p_pairs, *ds_pairs, *kt, *vt, *kr, *qr, *dor;
    float *dq, *dk, *dv;
  };
  // The pieces' sizes in floats, in pair_room's order: one list for the slot's size and its carving.
  static constexpr std::array<index_t, 11> pair_pieces(index_t steps, index_t head_dim) {
    namespace pairs = cpu_detail::tile_product;
    const index_t block = attention_rows(steps), even = steps + steps % 2;
    const index_t across = head_dim / 2 * pairs::padded(steps), along = even / 2 * pairs::padded(head_dim);
    const index_t paired = block / 2 * steps, floats = steps * head_dim;
    return {block * score_stride(steps) / 2, paired, paired, across, across, along, along, along, floats, floats, floats};
  }
  static constexpr index_t pair_room_floats(index_t steps, index_t head_dim) {
    return line_room(pair_pieces(steps, head_dim));
  }
  static pair_room carve(float* at, index_t steps, index_t head_dim) {
    const auto piece = line_pieces(at, pair_pieces(steps, head_dim));
    const auto word_at = [](float* x) { return reinterpret_cast<pair_word*>(x); };
    return {reinterpret_cast<bf16*>(piece[0]), word_at(piece[1]), word_at(piece[2]), word_at(piece[3]),
            word_at(piece[4]), word_at(piece[5]), word_at(piece[6]), word_at(piece[7]), piece[8], piece[9],
            piece[10]};
  }
  static const pair_word* words(const bf16* x) { return reinterpret_cast<const pair_word*>(x); }

  // attention_fwd_head on the CPU's bf16 dot products (tile_product): q, k, v at offsets 0, d, 2d of
  // rows with stride ld. K and V are paired once for the head; each block's scores come from q in
  // place, its probabilities are rounded to bf16 (rows of even length, zero past the last key) to
  // meet V. The row sums are the float probabilities'.
  template <class O, class Lse>
  static void attention_fwd_head_bf16(float* p, const bf16* q, index_t ld, O* out, index_t ldo, Lse* lse,
                                      index_t lse_ld, index_t steps, index_t head_dim, index_t d) {
    namespace pairs = cpu_detail::tile_product;
    const bf16 *k = q + d, *v = q + 2 * d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const index_t block = dot_rows, blocks = (steps + block - 1) / block;
    const index_t half = head_dim / 2, ldt = pairs::padded(steps), ldr = pairs::padded(head_dim);
    const pair_room room = carve(p + 2 * block * score_stride(steps), steps, head_dim);
    pair_word *kt = room.kt, *vr = room.kr;
    pairs::pack_columns(kt, ldt, k, ld, steps, head_dim);
    pairs::pack_rows(vr, ldr, v, ld, steps, head_dim);
    float* of = room.dq;
    float inv[max_attention_rows];
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * block, i1 = std::min(steps, i0 + block), rows = i1 - i0, w = i1 + i1 % 2;
      const index_t lds = score_stride(i1);
      const causal upto_key{causal::columns_to_row, i0};  // row i0 + r meets keys 0 .. i0 + r
      pairs::product(rows, i1, half, scale, words(q + i0 * ld), ld / 2, 1, kt, ldt, 0.0f, p, lds, upto_key);
      for (index_t r = 0; r < rows; ++r)
        lse[(i0 + r) * lse_ld] =
            static_cast<Lse>(cpu_detail::score_rows::softmax(p + r * lds, room.rows + r * lds, i0 + r + 1, w, inv[r]));
      pairs::product(rows, head_dim, w / 2, 1.0f, words(room.rows), lds / 2, 1, vr, ldr, 0.0f, of, head_dim,
                     {causal::reduction_to_row, i0});
      cpu_detail::narrow_head(out + i0 * ldo, ldo, of, rows, head_dim, inv);
    }
  }

  // attention_bwd_head on the CPU's bf16 dot products: q, k, v (offsets 0, d, 2d, stride ld) and
  // dO (stride ldo) paired once for the head; dQ, dK, dV summed in float and rounded once into dq,
  // dq + d, dq + 2d (stride ldd). P and dS are formed in float and rounded to bf16: dS in rows to
  // meet K, P and dS with the block's rows paired to meet dO and Q (the transposed products).
  template <class DQ, class Lse>
  static void attention_bwd_head_bf16(float* p, const bf16* q, index_t ld, const bf16* dout, index_t ldo, DQ* dq,
                                      index_t ldd, const Lse* lse, index_t lse_ld, index_t steps, index_t head_dim,
                                      index_t d) {
    namespace pairs = cpu_detail::tile_product;
    const bf16 *k = q + d, *v = q + 2 * d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const index_t block = dot_rows, blocks = (steps + block - 1) / block;
    const index_t half = head_dim / 2, ldt = pairs::padded(steps), ldr = pairs::padded(head_dim);
    float* dp = p + block * score_stride(steps);
    const pair_room room = carve(p + 2 * block * score_stride(steps), steps, head_dim);
    pairs::pack_columns(room.kt, ldt, k, ld, steps, head_dim);
    pairs::pack_columns(room.vt, ldt, v, ld, steps, head_dim);
    pairs::pack_rows(room.kr, ldr, k, ld, steps, head_dim);
    pairs::pack_rows(room.qr, ldr, q, ld, steps, head_dim);
    pairs::pack_rows(room.dor, ldr, dout, ldo, steps, head_dim);
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * block, i1 = std::min(steps, i0 + block), rows = i1 - i0, w = i1 + i1 % 2;
      const index_t lds = score_stride(i1);
      const causal upto_key{causal::columns_to_row, i0};
      pairs::product(rows, i1, half, scale, words(q + i0 * ld), ld / 2, 1, room.kt, ldt, 0.0f, p, lds, upto_key);
      pairs::product(rows, i1, half, 1.0f, words(dout + i0 * ldo), ldo / 2, 1, room.vt, ldt, 0.0f, dp, lds,
                     upto_key);
      // the score rows two at a time: P and dS rounded to bf16, dS in rows (to meet K) and both with
      // the block's rows paired (to meet dO and Q in the transposed products); an odd last row pairs
      // with zeros
      for (index_t r = 0; r < rows; r += 2) {
        using row = cpu_detail::score_rows::paired::backward_row;
        const index_t i = i0 + r;
        const row a{p + r * lds, dp + r * lds, room.rows + r * lds, i + 1, static_cast<float>(lse[i * lse_ld])};
        const row b = r + 1 < rows
                          ? row{a.pr + lds, a.dp + lds, a.ds + lds, i + 2, static_cast<float>(lse[(i + 1) * lse_ld])}
                          : row{a.pr, a.dp, nullptr, 0, 0.0f};
        cpu_detail::score_rows::paired::backward_pair(a, b, room.p_pairs + r / 2 * i1, room.ds_pairs + r / 2 * i1, i1);
      }
      // dV(0..i1) += Pᵀ dO, dK(0..i1) += scale·dSᵀ Q, dQ(block) = scale·dS K; rows at or past
      // i0 of dK and dV are first written by this block
      const index_t row_pairs = (rows + 1) / 2;
      const pair_word *dob = room.dor + i0 / 2 * ldr, *qb = room.qr + i0 / 2 * ldr;
      if (i0 > 0) {
        pairs::product(i0, head_dim, row_pairs, 1.0f, room.p_pairs, 1, i1, dob, ldr, 1.0f, room.dv, head_dim);
        pairs::product(i0, head_dim, row_pairs, scale, room.ds_pairs, 1, i1, qb, ldr, 1.0f, room.dk, head_dim);
      }
      const causal from_query{causal::reduction_from_row, 0};  // key i0 + r meets queries i0 + r on
      pairs::product(rows, head_dim, row_pairs, 1.0f, room.p_pairs + i0, 1, i1, dob, ldr, 0.0f,
                     room.dv + i0 * head_dim, head_dim, from_query);
      pairs::product(rows, head_dim, row_pairs, scale, room.ds_pairs + i0, 1, i1, qb, ldr, 0.0f,
                     room.dk + i0 * head_dim, head_dim, from_query);
      pairs::product(rows, head_dim, w / 2, scale, words(room.rows), lds / 2, 1, room.kr, ldr, 0.0f,
                     room.dq + i0 * head_dim, head_dim, {causal::reduction_to_row, i0});
    }
    cpu_detail::narrow_head(dq, ldd, room.dq, steps, head_dim);
    cpu_detail::narrow_head(dq + d, ldd, room.dk, steps, head_dim);
    cpu_detail::narrow_head(dq + 2 * d, ldd, room.dv, steps, head_dim);
  }
};

}  // namespace etude::backend
