// A whole bf16 matrix product on etude's own AVX512_BF16 kernels (avx512_tile_product.hpp): the products a
// bf16 step makes outside self-attention (projections, FFN, heads and their backward, cross-
// attention's blocks).
//
// C (m × n, float or bf16) = alpha·op(A)·op(B) + beta·C, A and B bf16, float accumulation. op(B)
// is packed into contiguous 64-column panels of pair words (the instruction's layout); the kernel
// keeps 6 rows × 64 columns in registers and runs over the whole reduction, so every output is
// one chain of additions in an order fixed by k alone: the result is the same bits whatever the
// team size, schedule or strides. A row-major A with an even reduction and leading dimension is
// read in place (a row of bf16 is a row of pairs); otherwise (a weight gradient's dYᵀ, an odd
// reduction) op(A) is paired too. A bf16 C is rounded once, from float, as bf16(float) rounds.
//
// Against oneDNN's bf16 matmul, which also packs B on every call, on small's and tiny's step
// shapes with 2 threads (a 2-core AVX512_BF16 CPU, model not recorded): 0.95–1.16× its speed alone
// (`build/bench/cpu_kernels --kernel gemm_bf16_avx512` against `--kernel gemm_bf16_onednn`, with
// each shape's --m --n --k), and 2–5% faster over a step (`build/bench/step_bench tiny
// --precision bf16`, and with ETUDE_BF16_GEMM=onednn), with no library needed.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "etude/backend/cpu/kernels/avx512_tile_product.hpp"
#include "etude/backend/cpu/tuning.hpp"
#include "etude/core/buffer.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/types.hpp"

namespace etude::backend::cpu_detail::tile_product {

inline constexpr index_t panel_columns = 64;                                  // the kernel's 4 vectors of 16 floats
using gemm_tuning = cpu_tuning<cpu_op::gemm, bf16, 0, cpu_isa::avx512_bf16>;  // tuning.hpp
inline constexpr index_t block_rows = gemm_tuning::block_rows;                // rows of A a thread takes at a time
// The panel-by-panel schedule streams all of op(A) once per panel: worth it while A stays in cache
// (small's FFN down-projection weight gradient, A 2 MiB: 1.04× oneDNN's speed, `--m 512 --n 2048
// --k 2048 --trans-a` on the commands above), not for a 2048² product (8 MiB: `--m 2048 --n 2048
// --k 2048 --trans-a`), which B packed in passes serves as well (0.93× either way); on a 2-core
// AVX512_BF16 CPU, model not recorded.
inline constexpr index_t panelwise_a_bytes = gemm_tuning::panelwise_a_bytes;

namespace gemm_detail {

// op(A)'s words as the kernel reads them: A(i, p) at a + i·row + p·pair.
struct a_words {
  const word* a;
  index_t row, pair;
  a_words from(index_t i) const { return {a + i * row, row, pair}; }
};

// Panel j of op(B) (k × n) as `words` × 64 words: B stored (k, n), or (n, k) multiplied
// transposed; rows past the reduction's pairs (AMX's whole steps) are zeros.
inline void pack_panel(word* dst, bool trans_b, const bf16* b, index_t ldb, index_t k, index_t n, index_t j,
                       index_t words) {
  const index_t cols = std::min(panel_columns, n - j);
  if (trans_b)
    pack_columns(dst, panel_columns, b + j * ldb, ldb, cols, k);
  else
    pack_rows(dst, panel_columns, b + j, ldb, k, cols);
  std::fill(dst + (k + 1) / 2 * panel_columns, dst + words * panel_columns, word(0));
}

// Rows [i0, i0 + rows) of op(A) paired into dst as (k+1)/2 rows of ld ≥ padded(rows) words.
inline a_words pair_rows_of_a(word* dst, index_t ld, bool trans_a, const bf16* a, index_t lda, index_t k, index_t i0,
                              index_t rows) {
  if (trans_a)
    pack_rows(dst, ld, a + i0, lda, k, rows);  // stored (k, m): its rows are op(A)'s columns
  else
    pack_columns(dst, ld, a + i0 * lda, lda, rows, k);
  return {dst, 1, ld};
}

// A buffer of the calling thread's own, at least `words` long (grown, never shrunk), on a 64-byte
// line (etude::buffer): AMX tiles load a row misaligned at a third of their speed (tdpbf16ps on
// 2 × 2 tiles of operands a line apart against 16 bytes apart: 2.9 against 1.0 TFLOP/s on one core
// of a 2-core AMX Xeon, a scratch loop of tile loads and tdpbf16ps, not kept).
inline word* own_words(buffer<word>& v, index_t words) {
  if (v.size() < words) v.resize(words);
  return v.data();
}

#ifdef ETUDE_CPU_X86_KERNELS
// Rows [i0, i0 + rows) of op(A) as AMX tiles read them in place: padded(rows) rows of `words` words
// (the pairs of a row together, zeros to the whole step and in rows past `rows`). A stored (k, m)
// is paired across its rows first, then transposed in blocks of 16 words (amx::rows_of_words).
inline a_words amx_rows_of_a(word* dst, index_t words, bool trans_a, const bf16* a, index_t lda, index_t k,
                             index_t i0, index_t rows) {
  const index_t pairs = (k + 1) / 2;
  if (trans_a) {
    thread_local buffer<word> across;
    word* paired = own_words(across, pairs * padded(rows));
    pack_rows(paired, padded(rows), a + i0, lda, k, rows);
    amx::rows_of_words(dst, words, padded(rows), paired, 1, padded(rows), 0, rows, 0, pairs);
  } else {
    for (index_t r = 0; r < padded(rows); ++r) {
      bf16* d = reinterpret_cast<bf16*>(dst + r * words);
      const index_t have = r < rows ? k : 0;
      if (have > 0) std::memcpy(d, a + (i0 + r) * lda, static_cast<std::size_t>(k) * sizeof(bf16));
      std::fill(d + have, d + 2 * words, bf16::from_bits(0));
    }
  }
  return {dst, words, 1};
}
#endif

}  // namespace gemm_detail

// What gemm does with a block of C once its values are final: nothing, or (an epilogue) a pass over
// it while it is in the core's caches, post(c, ldc, rows, cols) for the block at c, on the thread
// that computed it: a block of about block_rows rows by the panels a thread took for them (all of
// C's columns for the step's products), or by one panel in the panel-by-panel schedule. Every
// output is in exactly one block. GELU after the FFN's products in 64-column blocks made the
// epilogue slower than a pass of its own (the rows' scattered writes); by whole rows it is faster.
struct no_post {
  template <class TC>
  void operator()(TC*, index_t, index_t, index_t) const {}
};

// C = alpha·op(A)·op(B) + beta·C, row-major, any shape and strides; beta = 0 never reads C.
// Requires available(). Runs on a team it opens, or on the calling thread inside a parallel
// region. The workspace (may be null) holds the packed operand shared by the team; without one
// large enough a buffer of the calling thread's own does.
//
// Two schedules, the same arithmetic. Where op(B)'s panels fit the room, the team packs them once
// and threads share them, taking blocks of rows. Where they do not (a weight gradient's activations:
// k·n large) and op(A) is the smaller and fits in cache, each thread packs the panels it takes into
// a buffer of its own and multiplies every row by them, op(A) paired once into the room when it is
// not read in place. Otherwise B is packed in passes of as many panels as fit. `post` (above) sees
// every block of C once, after its last addition.
template <class TC, class Post = no_post>
void gemm(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, float alpha, const bf16* a, index_t lda,
          const bf16* b, index_t ldb, float beta, TC* c, index_t ldc, void* workspace, std::size_t workspace_bytes,
          const Post& post = {}) {
  static_assert(std::is_same_v<TC, float> || std::is_same_v<TC, bf16>, "tile_product::gemm writes float or bf16");
  using gemm_detail::a_words;
  if (m <= 0 || n <= 0) return;
  const index_t pairs = (k + 1) / 2;
  // On AMX tiles the reduction runs in whole steps of 16 words: the panels and a paired op(A) carry
  // zeros to the next one (the sums' bits are the same), so every product reads its operands in
  // place, and rows go in blocks of whole 32-row tile pairs.
  const bool amx = amx_tiles();
  const index_t words = amx ? amx_words(pairs) : pairs, row_unit = amx ? 2 * amx_words(1) : tile_rows;
  const index_t panel_words = words * panel_columns;
  const index_t all_panels = (n + panel_columns - 1) / panel_columns;
  const bool in_place = !trans_a && k % 2 == 0 && lda % 2 == 0 && words == pairs;
  const a_words direct{reinterpret_cast<const word*>(a), lda / 2, 1};
  // op(A)'s rows [i0, i0 + rows) paired into dst, which holds a_room(rows) words
  const auto a_room = [&](index_t rows) { return amx ? padded(rows) * words : pairs * padded(rows); };
  const auto pair_a = [&](word* dst, index_t i0, index_t rows) {
#ifdef ETUDE_CPU_X86_KERNELS
    if (amx) return gemm_detail::amx_rows_of_a(dst, words, trans_a, a, lda, k, i0, rows);
#endif
    return gemm_detail::pair_rows_of_a(dst, padded(rows), trans_a, a, lda, k, i0, rows);
  };

  const bool nested = omp_in_parallel() != 0;
  index_t room = static_cast<index_t>(workspace_bytes / sizeof(word));
  word* shared = static_cast<word*>(workspace);
  if (workspace == nullptr || nested || room < panel_words) {
    // no room of the caller's (or one other threads of the region may be using): the thread's own
    thread_local buffer<word> callers;
    room = workspace == nullptr || nested ? all_panels * panel_words : panel_words;
    shared = gemm_detail::own_words(callers, room);
  }

  const bool b_fits = all_panels * panel_words <= room;
  const bool a_fits = in_place || a_room(m) <= room;
  if (!b_fits && a_fits && m <= n && m * k * index_t{sizeof(bf16)} <= panelwise_a_bytes) {
#pragma omp parallel if (!nested)
    {
      // paired, op(A)'s rows in blocks of block_rows: block i0 at shared + i0 (pairs across the rows,
      // a row of `padded(m)` words for each pair) or, for AMX, at row i0 of rows of `words` words
      const a_words whole = in_place ? direct : amx ? a_words{shared, words, 1} : a_words{shared, 1, padded(m)};
      if (!in_place) {
#pragma omp for schedule(static)
        for (index_t i0 = 0; i0 < m; i0 += block_rows) {
          const index_t rows = std::min(block_rows, m - i0);
          if (amx)
            pair_a(shared + i0 * words, i0, rows);
          else
            gemm_detail::pair_rows_of_a(shared + i0, padded(m), trans_a, a, lda, k, i0, rows);
        }
      }
      thread_local buffer<word> mine;
      word* panel = gemm_detail::own_words(mine, panel_words);
#pragma omp for schedule(static)
      for (index_t p = 0; p < all_panels; ++p) {
        const index_t j = p * panel_columns, cols = std::min(panel_columns, n - j);
        gemm_detail::pack_panel(panel, trans_b, b, ldb, k, n, j, words);
        for (index_t i0 = 0; i0 < m; i0 += block_rows) {
          const a_words at = whole.from(i0);
          const index_t rows = std::min(block_rows, m - i0);
          product(rows, cols, words, alpha, at.a, at.row, at.pair, panel, panel_columns, beta, c + i0 * ldc + j, ldc);
          post(c + i0 * ldc + j, ldc, rows, cols);
        }
      }
    }
    return;
  }

  const index_t pass_panels = std::max<index_t>(1, room / std::max<index_t>(1, panel_words));
  const index_t tiles = (m + row_unit - 1) / row_unit;
#pragma omp parallel if (!nested)
  {
    const index_t team = omp_get_num_threads();
    // blocks of about block_rows, as many for each thread, in whole tiles of 6 rows, or of 32 on AMX
    // (tiny's and small's 2048 rows in 96-row blocks left one thread a third of a block more)
    const index_t per_thread = (tiles + team - 1) / team;
    const index_t blocks = std::min(tiles, team * ((per_thread * row_unit + block_rows - 1) / block_rows));
    for (index_t p0 = 0; p0 < all_panels; p0 += pass_panels) {
      const index_t panels = std::min(pass_panels, all_panels - p0);
#pragma omp for schedule(static)
      for (index_t p = 0; p < panels; ++p)
        gemm_detail::pack_panel(shared + p * panel_words, trans_b, b, ldb, k, n, (p0 + p) * panel_columns, words);
      // blocks of rows, each cut into as many runs of panels as keep every thread busy
      const index_t runs = std::min(panels, std::max<index_t>(1, (2 * team + blocks - 1) / blocks));
      const index_t per_run = (panels + runs - 1) / runs;
#pragma omp for schedule(static)
      for (index_t item = 0; item < blocks * runs; ++item) {
        const index_t block = item / runs;
        const index_t i0 = block * tiles / blocks * row_unit;
        const index_t rows = std::min(m, (block + 1) * tiles / blocks * row_unit) - i0;
        const index_t q0 = item % runs * per_run, q1 = std::min(panels, q0 + per_run);
        if (q0 >= q1 || rows <= 0) continue;
        thread_local buffer<word> mine;
        const a_words at = in_place ? direct.from(i0) : pair_a(gemm_detail::own_words(mine, a_room(rows)), i0, rows);
        for (index_t q = q0; q < q1; ++q) {
          const index_t j = (p0 + q) * panel_columns, cols = std::min(panel_columns, n - j);
          product(rows, cols, words, alpha, at.a, at.row, at.pair, shared + q * panel_words, panel_columns, beta,
                  c + i0 * ldc + j, ldc);
        }
        const index_t j0 = (p0 + q0) * panel_columns, j1 = std::min(n, (p0 + q1) * panel_columns);
        post(c + i0 * ldc + j0, ldc, rows, j1 - j0);
      }
    }
  }
}

}  // namespace etude::backend::cpu_detail::tile_product
