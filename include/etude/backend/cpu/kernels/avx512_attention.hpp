// Self-attention's heads on etude's AVX-512 kernels (attention.hpp dispatches here): float heads on
// the tile kernels' float products (vfmadd231ps), bf16 heads on their bf16 pair products
// (vdpbf16ps), operands laid out once per head in the slot's room, the diagonal block's masked
// corner left out (tile_product::causal) with the same bits. Callers check
// tile_product::available() first. Not the portable heads, which stay in attention.hpp.
//
// bf16: operands paired once per head, scores and dP from q and dO in place, P and dS rounded two
// vectors at a time, the backward's two rows at once straight into the paired words
// (score_rows::paired). The diagonal block's products leave out its masked corner: scores past a
// row's last key by vectors of 16, the pairs of zero probabilities or dS by tiles of 6 rows. Tiny
// bf16's attention takes 15.8 ms a step at T = 256 and tiny_long bf16's 87.5–90.3 ms (forward and
// backward, 2 threads, a 2-core AVX512_BF16 CPU, model not recorded: `build/bench/step_bench tiny --precision bf16
// --profile`, `build/bench/step_bench tiny_long --precision bf16 --profile`).
// float: the same kernels on floats (vfmadd231ps), K and V laid out once per head, with the same
// corners left out: attention takes 26 ms a step in tiny fp32, 202 in small, 166 in tiny_long
// (`build/bench/step_bench tiny --profile`, and small, tiny_long; the same CPU), below oneDNN's
// products on the portable path.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "etude/backend/cpu/detail/attention_blocks.hpp"
#include "etude/backend/cpu/detail/head_slots.hpp"
#include "etude/backend/cpu/detail/score_rows.hpp"
#include "etude/backend/cpu/kernels/avx512_tile_product.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/types.hpp"

namespace etude::backend::cpu_detail {

struct avx512_attention : attention_blocks {
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
    return {
        block * score_stride(steps) / 2, paired, paired, across, across, along, along, along, floats, floats, floats};
  }
  static constexpr index_t pair_room_floats(index_t steps, index_t head_dim) {
    return line_room(pair_pieces(steps, head_dim));
  }
  static pair_room carve(float* at, index_t steps, index_t head_dim) {
    const auto piece = line_pieces(at, pair_pieces(steps, head_dim));
    const auto word_at = [](float* x) { return reinterpret_cast<pair_word*>(x); };
    return {reinterpret_cast<bf16*>(piece[0]),
            word_at(piece[1]),
            word_at(piece[2]),
            word_at(piece[3]),
            word_at(piece[4]),
            word_at(piece[5]),
            word_at(piece[6]),
            word_at(piece[7]),
            piece[8],
            piece[9],
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
      pairs::product(rows, i1, half, 1.0f, words(dout + i0 * ldo), ldo / 2, 1, room.vt, ldt, 0.0f, dp, lds, upto_key);
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
      pairs::product(rows, head_dim, row_pairs, 1.0f, room.p_pairs + i0, 1, i1, dob, ldr, 0.0f, room.dv + i0 * head_dim,
                     head_dim, from_query);
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

}  // namespace etude::backend::cpu_detail
