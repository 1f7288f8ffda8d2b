// etude's own bf16 products on AVX512_BF16 (vdpbf16ps: two bf16 products added to a float lane),
// for attention's per-head blocks. oneDNN's matmul repacks an operand into its pair layout on
// every call; a head's blocks meet the same K, V, Q and dO many times, so these products take
// operands already in that layout, packed once per head.
//
// The layout: a 32-bit word holds two bf16 that meet the same output, the even reduction index in
// its low half. B (reduction × columns) is `pairs` rows of words, ldb words apart, its columns
// readable up to the next multiple of 16 (the packers write zeros there). A (rows × reduction) is
// read a word at a time at a + i·a_row + p·a_pair, so a row-major bf16 matrix (a_row = ld/2,
// a_pair = 1) and a pair-interleaved one seen transposed (a_row = 1, a_pair = ld) both serve.
// An odd reduction's last pair carries a zero in both operands' high halves.
//
// The same kernels multiply floats (a word is then one float, the instruction vfmadd231ps): fp32
// attention's blocks, on operands laid out once per head the same way.
//
// The instructions flush bf16 subnormals (below 2^-126) to zero and round each addition to float;
// the order of additions is fixed by the shape, so a result is the same bits on every call.
// available() says whether this CPU has them (checked once: AVX512_BF16 with AVX-512 Compute, BW, VL and
// DQ, which every CPU with AVX512_BF16 has); callers keep another path for CPUs without.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "etude/backend/cpu/kernels/avx512_vmath.hpp"
#include "etude/backend/cpu/kernels/isa.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::backend::cpu_detail::tile_product {

using word = std::uint32_t;

using vmath512::lanes;
using vmath512::padded;

// rows of C a kernel call keeps in registers: 6 × 4 accumulators, 4 B vectors and a broadcast, 29
// of 32 (here, outside the kernels, for the schedules that split work in whole tiles on any build)
inline constexpr int tile_rows = 6;

// What a product with a causal operand (attention's diagonal blocks) leaves out, row i of C (from
// the call's first row) standing for query or key `offset + i`:
//   columns_to_row     C(i, j) is wanted for j ≤ offset + i only (scores; the rest may be left)
//   reduction_to_row   A(i, p) = 0 for p > offset + i (probabilities past a row's last key)
//   reduction_from_row A(i, p) = 0 for p < offset + i (Pᵀ: a key meets the queries at or after it)
// The first is cut at 16 columns, the others at a tile's words: the products skipped are of zeros
// with finite values, or outputs nobody reads, so the results are the full product's bits.
struct causal {
  enum kind : int { none, columns_to_row, reduction_to_row, reduction_from_row };
  kind what = none;
  index_t offset = 0;

  // the words [first, end) of the reduction that rows [i, i + rows) meet, of `words`, a word
  // holding `per` of its indices (2 for bf16 pairs, 1 for floats)
  index_t first_word(index_t i, index_t per) const {
    return what == reduction_from_row ? std::max<index_t>(0, offset + i) / per : 0;
  }
  index_t end_word(index_t i, index_t rows, index_t words, index_t per) const {
    return what == reduction_to_row ? std::min(words, std::max<index_t>(0, offset + i + rows - 1) / per + 1) : words;
  }
};

// A reduction's words rounded up to AMX tiles' whole steps of 16 (amx_tile_product.hpp).
inline constexpr index_t amx_words(index_t words) { return (words + 15) / 16 * 16; }

inline word join(bf16 lo, bf16 hi) { return static_cast<word>(lo.bits) | (static_cast<word>(hi.bits) << 16); }

#ifdef ETUDE_CPU_X86_KERNELS

inline bool available() { return isa::avx512_bf16(); }

namespace kernel {

// The 16 × 16 words of x transposed in place: pairs of rows interleaved by 32 and by 64 bits within
// each 128-bit lane, then the lanes of four registers transposed as 4 × 4 blocks (64 shuffles).
ETUDE_CPU_AVX512_BF16_TARGET inline void transpose_16x16(__m512i (&x)[16]) {
  // all-lanes masked forms: GCC 12's unmasked shuffles start from an "undefined" register
  constexpr __mmask16 all = 0xFFFF;
  constexpr __mmask8 all64 = 0xFF;
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_maskz_unpacklo_epi32(all, x[2 * k], x[2 * k + 1]);
    t[2 * k + 1] = _mm512_maskz_unpackhi_epi32(all, x[2 * k], x[2 * k + 1]);
  }
  // u[4k + j] holds, in lane L, word 4L + j of rows 4k .. 4k + 3
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    u[4 * k] = _mm512_maskz_unpacklo_epi64(all64, t[4 * k], t[4 * k + 2]);
    u[4 * k + 1] = _mm512_maskz_unpackhi_epi64(all64, t[4 * k], t[4 * k + 2]);
    u[4 * k + 2] = _mm512_maskz_unpacklo_epi64(all64, t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm512_maskz_unpackhi_epi64(all64, t[4 * k + 1], t[4 * k + 3]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i s0 = _mm512_maskz_shuffle_i32x4(all, u[j], u[4 + j], 0x88);
    const __m512i s1 = _mm512_maskz_shuffle_i32x4(all, u[j], u[4 + j], 0xdd);
    const __m512i s2 = _mm512_maskz_shuffle_i32x4(all, u[8 + j], u[12 + j], 0x88);
    const __m512i s3 = _mm512_maskz_shuffle_i32x4(all, u[8 + j], u[12 + j], 0xdd);
    x[j] = _mm512_maskz_shuffle_i32x4(all, s0, s2, 0x88);
    x[8 + j] = _mm512_maskz_shuffle_i32x4(all, s0, s2, 0xdd);
    x[4 + j] = _mm512_maskz_shuffle_i32x4(all, s1, s3, 0x88);
    x[12 + j] = _mm512_maskz_shuffle_i32x4(all, s1, s3, 0xdd);
  }
}

// dst word (q, r) = the word at src + r·ld + 2q, for r < rows and q < pairs: blocks of 16 rows
// × 16 words transposed in registers (fewer cycles a word than a gather per 16 rows).
ETUDE_CPU_AVX512_BF16_TARGET inline void transpose_pairs(word* dst, index_t ldd, const bf16* src, index_t ld,
                                                         index_t rows, index_t pairs) {
  for (index_t q = 0; q < pairs; q += lanes) {
    const __mmask16 w = vmath512::valid(q, pairs);
    for (index_t r = 0; r < rows; r += lanes) {
      const __mmask16 m = vmath512::valid(r, rows);
      const int rn = static_cast<int>(std::min(lanes, rows - r));
      __m512i x[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        x[i] = i < rn ? _mm512_maskz_loadu_epi32(w, src + (r + i) * ld + 2 * q) : _mm512_setzero_si512();
      transpose_16x16(x);
      const int qn = static_cast<int>(std::min(lanes, pairs - q));
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        if (i < qn) _mm512_mask_storeu_epi32(dst + (q + i) * ldd + r, m, x[i]);
    }
  }
}

// dst word (r/2, c) = rows r and r+1 of column c (a zero for a missing last row), for c up to
// padded(cols) (zeros past cols): two rows of 32 bf16 interleaved by two vpermt2w into 32 words.
ETUDE_CPU_AVX512_BF16_TARGET inline void interleave_rows(word* dst, index_t ldd, const bf16* src, index_t ld,
                                                         index_t rows, index_t cols) {
  alignas(64) static constexpr std::uint16_t low[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr std::uint16_t high[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                         53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                         27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(low), hi = _mm512_load_si512(high);
  const index_t end = padded(cols);
  for (index_t r = 0; r < rows; r += 2) {
    const bf16* s0 = src + r * ld;
    const bf16* s1 = r + 1 < rows ? s0 + ld : nullptr;
    word* d = dst + (r / 2) * ldd;
    for (index_t c = 0; c < end; c += 2 * lanes) {
      const __mmask32 m = cols - c >= 32 ? ~__mmask32(0) : static_cast<__mmask32>((std::uint64_t{1} << (cols - c)) - 1);
      const __m512i a = _mm512_maskz_loadu_epi16(m, s0 + c);
      const __m512i b = s1 != nullptr ? _mm512_maskz_loadu_epi16(m, s1 + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(d + c, _mm512_permutex2var_epi16(a, lo, b));
      if (c + lanes < end) _mm512_storeu_si512(d + c + lanes, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

inline word load_word(const word* p) {
  word w;
  std::memcpy(&w, p, sizeof w);
  return w;
}

using vmath512::round_to_bf16;

// o[0..16) under mask m = alpha·x + beta·o, o float or bf16 (widened, then rounded once).
ETUDE_CPU_AVX512_BF16_TARGET inline void store(float* o, __mmask16 m, __m512 x, __m512 va, float beta, __m512 vb) {
  x = _mm512_mul_ps(x, va);
  if (beta != 0.0f) x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, o), vb, x);
  _mm512_mask_storeu_ps(o, m, x);
}
ETUDE_CPU_AVX512_BF16_TARGET inline void store(bf16* o, __mmask16 m, __m512 x, __m512 va, float beta, __m512 vb) {
  x = _mm512_mul_ps(x, va);
  if (beta != 0.0f) {
    const __m512i old = _mm512_maskz_cvtepu16_epi32(m, _mm256_maskz_loadu_epi16(m, o));
    x = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_maskz_slli_epi32(m, old, 16)), vb, x);
  }
  _mm256_mask_storeu_epi16(o, m, round_to_bf16(x));
}

// x0 and x1 rounded to bf16, x0's 16 values in the low 256 bits: one vcvtne2ps2bf16, which rounds
// as bf16(float) does (to nearest even, NaN quietened) but reads subnormal floats as zero, so two
// vectors holding one go through round_to_bf16 instead. Half the rounding's instructions, in the
// kernels' bf16 stores (store_pair) and in attention's and the heads' bf16 rows (score_rows::paired).
// A subnormal is found by vfpclassps (class 0x20), one instruction a vector (fewer than two mask
// tests): attention's forward bf16 score rows take 0.62 cycles of the time-stamp counter a score
// (1024-key rows, a 2-core AVX512_BF16 CPU, model not recorded: `build/bench/cpu_kernels --kernel
// score_rows_bf16_avx512`).
ETUDE_CPU_AVX512_BF16_TARGET inline __m512i round_two(__m512 x0, __m512 x1) {
  constexpr int subnormal = 0x20;
  const __mmask16 sub0 = _mm512_fpclass_ps_mask(x0, subnormal), sub1 = _mm512_fpclass_ps_mask(x1, subnormal);
  if ((sub0 | sub1) != 0)
    return _mm512_maskz_inserti64x4(0xFF, _mm512_castsi256_si512(round_to_bf16(x0)), round_to_bf16(x1), 1);
  return (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
}

// o[0..32) = x0, x1 rounded to bf16 (round_two). A short reduction feels the rounding: tiny bf16's
// forward projections (K = 256, bf16 out) run at 421 GFLOP/s (a 2-core AVX512_BF16 CPU, model not recorded, 2 threads:
// `build/bench/cpu_kernels --kernel gemm_bf16_avx512 --m 2048 --n 768 --k 256`), 5% faster than
// with a rounding a vector at a time; small's (K = 512) did not measurably change.
ETUDE_CPU_AVX512_BF16_TARGET inline void store_pair(bf16* o, __m512 x0, __m512 x1) {
  _mm512_storeu_si512(o, round_two(x0, x1));
}

// o[j] = bf16(f[j]·scale) for j < n: two vectors at a time by round_two, a masked tail by
// round_to_bf16 (bf16(float)'s bits either way; ·1 changes no value). The rows of floats the CPU
// rounds to bf16 outside the kernels: the heads' gradients (softmax_xent) and attention's heads
// (narrow_head; as a loop of elements it was 3% of tiny's bf16 attention at T = 256). Compare
// `build/bench/cpu_kernels --kernel round_bf16_avx512` and `--kernel round_bf16_portable`.
ETUDE_CPU_AVX512_BF16_TARGET inline void round_row(bf16* o, const float* f, index_t n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  index_t j = 0;
  for (; j + 2 * lanes <= n; j += 2 * lanes)
    store_pair(o + j, _mm512_mul_ps(_mm512_loadu_ps(f + j), s), _mm512_mul_ps(_mm512_loadu_ps(f + j + lanes), s));
  for (; j < n; j += lanes) {
    const __mmask16 m = vmath512::valid(j, n);
    _mm256_mask_storeu_epi16(o + j, m, round_to_bf16(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, f + j), s)));
  }
}

// Rows × (16·V) outputs in registers; `last` masks the final vector's columns. W is a word of bf16
// pairs (vdpbf16ps) or a float (vfmadd231ps): `words` steps of the reduction either way.
template <int Rows, int V, class W, class TC>
ETUDE_CPU_AVX512_BF16_TARGET inline void tile(index_t words, const W* a, index_t a_row, index_t a_pair, const W* b,
                                              index_t ldb, float alpha, float beta, TC* c, index_t ldc,
                                              __mmask16 last) {
  __m512 acc[Rows][V];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (index_t p = 0; p < words; ++p) {
    if constexpr (std::is_same_v<W, float>) {
      __m512 bv[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) bv[v] = _mm512_loadu_ps(b + p * ldb + v * lanes);
#pragma GCC unroll 8
      for (int r = 0; r < Rows; ++r) {
        const __m512 av = _mm512_set1_ps(a[r * a_row + p * a_pair]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
      }
    } else {
      __m512bh bv[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + p * ldb + v * lanes);
#pragma GCC unroll 8
      for (int r = 0; r < Rows; ++r) {
        const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(load_word(a + r * a_row + p * a_pair)));
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
      }
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  if constexpr (std::is_same_v<TC, bf16> && V % 2 == 0) {
    if (alpha == 1.0f && beta == 0.0f && last == __mmask16(0xFFFF)) {
#pragma GCC unroll 8
      for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 2
        for (int v = 0; v < V; v += 2) store_pair(c + r * ldc + v * lanes, acc[r][v], acc[r][v + 1]);
      return;
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      store(c + r * ldc + v * lanes, v + 1 == V ? last : __mmask16(0xFFFF), acc[r][v], va, beta, vb);
}

inline constexpr int tile_vectors = 4;

// Rows [i, i + Rows) over the words of the reduction `shape` leaves them.
template <int Rows, int V, class W, class TC>
ETUDE_CPU_AVX512_BF16_TARGET inline void shaped_tile(index_t i, index_t words, const W* a, index_t a_row,
                                                     index_t a_pair, const W* b, index_t ldb, float alpha, float beta,
                                                     TC* c, index_t ldc, __mmask16 last, causal shape) {
  constexpr index_t per = std::is_same_v<W, float> ? 1 : 2;
  const index_t p0 = shape.first_word(i, per), p1 = std::max(p0, shape.end_word(i, Rows, words, per));
  tile<Rows, V>(p1 - p0, a + i * a_row + p0 * a_pair, a_row, a_pair, b + p0 * ldb, ldb, alpha, beta, c + i * ldc, ldc,
                last);
}

template <int V, class W, class TC>
ETUDE_CPU_AVX512_BF16_TARGET inline void column_panel(index_t m, index_t words, const W* a, index_t a_row,
                                                      index_t a_pair, const W* b, index_t ldb, float alpha, float beta,
                                                      TC* c, index_t ldc, __mmask16 last, causal shape) {
  index_t i = 0;
  for (; i + tile_rows <= m; i += tile_rows)
    shaped_tile<tile_rows, V>(i, words, a, a_row, a_pair, b, ldb, alpha, beta, c, ldc, last, shape);
  switch (m - i) {
    case 5:
      shaped_tile<5, V>(i, words, a, a_row, a_pair, b, ldb, alpha, beta, c, ldc, last, shape);
      break;
    case 4:
      shaped_tile<4, V>(i, words, a, a_row, a_pair, b, ldb, alpha, beta, c, ldc, last, shape);
      break;
    case 3:
      shaped_tile<3, V>(i, words, a, a_row, a_pair, b, ldb, alpha, beta, c, ldc, last, shape);
      break;
    case 2:
      shaped_tile<2, V>(i, words, a, a_row, a_pair, b, ldb, alpha, beta, c, ldc, last, shape);
      break;
    case 1:
      shaped_tile<1, V>(i, words, a, a_row, a_pair, b, ldb, alpha, beta, c, ldc, last, shape);
      break;
    default:
      break;
  }
}

// Rows [0, m) of one panel of `vectors` vectors of 16 columns.
template <class W, class TC>
ETUDE_CPU_AVX512_BF16_TARGET inline void panel(int vectors, index_t m, index_t words, const W* a, index_t a_row,
                                               index_t a_pair, const W* b, index_t ldb, float alpha, float beta, TC* c,
                                               index_t ldc, __mmask16 last, causal shape) {
  switch (vectors) {
    case 4:
      column_panel<4>(m, words, a, a_row, a_pair, b, ldb, alpha, beta, c, ldc, last, shape);
      break;
    case 3:
      column_panel<3>(m, words, a, a_row, a_pair, b, ldb, alpha, beta, c, ldc, last, shape);
      break;
    case 2:
      column_panel<2>(m, words, a, a_row, a_pair, b, ldb, alpha, beta, c, ldc, last, shape);
      break;
    default:
      column_panel<1>(m, words, a, a_row, a_pair, b, ldb, alpha, beta, c, ldc, last, shape);
      break;
  }
}

}  // namespace kernel

// The AMX tiles' path for word products (amx_tile_product.hpp, included at the end).
inline bool amx_tiles();
template <class TC>
void amx_product(index_t m, index_t n, index_t words, float alpha, const word* a, index_t a_row, index_t a_pair,
                 const word* b, index_t ldb, float beta, TC* c, index_t ldc, causal shape);

// C (m × n, float or bf16, row stride ldc) = alpha·Σ_p A(i, p)·B(p, j) + beta·C over `words` words,
// on the calling thread; a bf16 C is rounded once, from float. beta = 0 never reads C. The words
// are bf16 pairs, or floats (A and B in float, each output one chain of fused multiply-adds in the
// reduction's order). `shape` says what a causal operand leaves out (above). Requires available().
// Where amx_tiles(), word products run on AMX tiles instead (amx_tile_product.hpp: the same
// contract, tdpbf16ps's bits).
template <class W, class TC>
ETUDE_CPU_AVX512_BF16_TARGET inline void product(index_t m, index_t n, index_t words, float alpha, const W* a,
                                                 index_t a_row, index_t a_pair, const W* b, index_t ldb, float beta,
                                                 TC* c, index_t ldc, causal shape = {}) {
  static_assert(std::is_same_v<W, word> || std::is_same_v<W, float>,
                "tile_product::product multiplies pairs or floats");
  if constexpr (std::is_same_v<W, word>) {
    if (amx_tiles()) {
      amx_product(m, n, words, alpha, a, a_row, a_pair, b, ldb, beta, c, ldc, shape);
      return;
    }
  }
  constexpr index_t width = kernel::tile_vectors * lanes;
  for (index_t j = 0; j < n; j += width) {
    const index_t cols = std::min(width, n - j);
    const int vectors = static_cast<int>((cols + lanes - 1) / lanes);
    const index_t tail = cols - (vectors - 1) * lanes;
    const __mmask16 last = static_cast<__mmask16>((1u << tail) - 1u);
    if (shape.what != causal::columns_to_row) {
      kernel::panel(vectors, m, words, a, a_row, a_pair, b + j, ldb, alpha, beta, c + j, ldc, last, shape);
      continue;
    }
    // row i wants columns up to offset + i: none of this panel before row j − offset, then
    // rows in runs of 16 that want one more of its vectors each
    for (index_t r = std::clamp<index_t>(j - shape.offset, 0, m); r < m;) {
      const int want = static_cast<int>(std::min<index_t>(vectors, (shape.offset + r - j) / lanes + 1));
      const index_t end = want == vectors ? m : std::min(m, j - shape.offset + want * lanes);
      kernel::panel(want, end - r, words, a + r * a_row, a_row, a_pair, b + j, ldb, alpha, beta, c + r * ldc + j, ldc,
                    want == vectors ? last : __mmask16(0xFFFF), causal{});
      r = end;
    }
  }
}

#else

inline bool available() { return false; }

// Callers check available() first; the declaration keeps their code one path on other CPUs.
template <class W, class TC>
void product(index_t, index_t, index_t, float, const W*, index_t, index_t, const W*, index_t, float, TC*, index_t,
             causal = {}) {
  throw error("cpu tile_product::product: built for a CPU without AVX512_BF16; check available() first");
}

#endif

// pack_rows (below) as the portable loop, on any CPU.
inline void pack_rows_portable(word* dst, index_t ldd, const bf16* src, index_t ld, index_t rows, index_t cols) {
  const bf16 zero = bf16::from_bits(0);
  for (index_t r = 0; r < rows; r += 2) {
    const bf16* s0 = src + r * ld;
    const bf16* s1 = r + 1 < rows ? s0 + ld : nullptr;
    word* d = dst + (r / 2) * ldd;
    if (s1 != nullptr) {
#pragma omp simd
      for (index_t c = 0; c < cols; ++c) d[c] = join(s0[c], s1[c]);
    } else {
#pragma omp simd
      for (index_t c = 0; c < cols; ++c) d[c] = join(s0[c], zero);
    }
    std::fill(d + cols, d + padded(cols), word(0));
  }
}

// B from a row-major (rows × cols) bf16 matrix multiplied from the left (reduction over its rows):
// dst word (r/2, c) holds rows r and r+1 of column c; ldd ≥ padded(cols) words. By vpermt2w where
// the CPU has it (kernel::interleave_rows): a weight gradient's activations are paired so in blocks
// of 85–96 columns, whose scalar remainders slow the element loop from cold caches. The permutes
// take 0.80 cycles of the time-stamp counter a word from cold caches and 0.37 warm (85 columns of a
// 1024-wide matrix; the element loop 1.25 and 0.46), on a 2-core AVX512_BF16 CPU, model not
// recorded: `build/bench/cpu_kernels --kernel pack_rows_avx512` against `--kernel pack_rows_portable`
// (warm; --cold for cold caches).
inline void pack_rows(word* dst, index_t ldd, const bf16* src, index_t ld, index_t rows, index_t cols) {
#ifdef ETUDE_CPU_X86_KERNELS
  if (available()) {
    kernel::interleave_rows(dst, ldd, src, ld, rows, cols);
    return;
  }
#endif
  pack_rows_portable(dst, ldd, src, ld, rows, cols);
}

// pack_columns (below) as the portable loop, on any CPU, from column `first` (even) on.
inline void pack_columns_portable(word* dst, index_t ldd, const bf16* src, index_t ld, index_t rows, index_t cols,
                                  index_t first = 0) {
  const bf16 zero = bf16::from_bits(0);
  for (index_t c = first; c < cols; c += 2) {
    word* d = dst + (c / 2) * ldd;
    const bf16* s = src + c;
    if (c + 1 < cols) {
#pragma omp simd
      for (index_t r = 0; r < rows; ++r) d[r] = join(s[r * ld], s[r * ld + 1]);
    } else {
#pragma omp simd
      for (index_t r = 0; r < rows; ++r) d[r] = join(s[r * ld], zero);
    }
    std::fill(d + rows, d + padded(rows), word(0));
  }
}

// B from a row-major (rows × cols) bf16 matrix multiplied transposed (reduction over its columns):
// dst word (c/2, r) holds columns c and c+1 of row r (an odd last column with a zero); ldd ≥
// padded(rows). The same layout read with a_row = 1, a_pair = ldd is a row-major A paired.
// A word is two neighbours of a row as they lie in memory, so this is a transpose of 32-bit words:
// in blocks of 16 × 16 in registers where the CPU has them (kernel::transpose_pairs; the element
// loop was a tenth of a 2048×512×2048 product whose B is a weight multiplied transposed). Compare
// `build/bench/cpu_kernels --kernel pack_columns_avx512` and `--kernel pack_columns_portable`.
inline void pack_columns(word* dst, index_t ldd, const bf16* src, index_t ld, index_t rows, index_t cols) {
  index_t c = 0;
#ifdef ETUDE_CPU_X86_KERNELS
  if (available() && cols >= 2) {
    kernel::transpose_pairs(dst, ldd, src, ld, rows, cols / 2);
    for (; c + 1 < cols; c += 2) std::fill(dst + (c / 2) * ldd + rows, dst + (c / 2) * ldd + padded(rows), word(0));
  }
#endif
  pack_columns_portable(dst, ldd, src, ld, rows, cols, c);
}

}  // namespace etude::backend::cpu_detail::tile_product

// The AMX tiles' word products, where the CPU has them (after everything they build on).
#include "etude/backend/cpu/kernels/amx_tile_product.hpp"  // NOLINT(misc-header-include-cycle)
