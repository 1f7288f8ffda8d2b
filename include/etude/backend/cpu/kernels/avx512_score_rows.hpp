// The AVX-512 kernels of attention's score rows (detail/score_rows.hpp holds the portable loops and
// the dispatch): the forward's softmax and the backward's P and dS on avx512_vmath's exponential (14
// instructions for 16 lanes, against the 37 GCC 12 makes of vexp), the masked keys past a row's
// last valid one lanes of a mask rather than values written first; and, where the CPU has
// AVX512_BF16 (`paired`), bf16 rows rounded two vectors at a time and the backward's paired words
// formed for two rows at once. Callers check vmath512::available() (kernel) or
// tile_product::available() (paired) first.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "etude/backend/cpu/kernels/avx512_tile_product.hpp"
#include "etude/backend/cpu/kernels/avx512_vmath.hpp"
#include "etude/backend/cpu/kernels/isa.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::backend::cpu_detail::score_rows {

using vmath512::lanes;
using vmath512::padded;

namespace paired {
// One row of a block for backward_pair (below): scores (becoming P) in pr, dP in dp, dS's bf16 row
// in ds.
struct backward_row {
  float* pr;
  const float* dp;
  bf16* ds;
  index_t keys;
  float lse;
};
}  // namespace paired

#ifdef ETUDE_CPU_X86_KERNELS

namespace kernel {

using vmath512::all;
using vmath512::exp16;
using vmath512::lane_max;
using vmath512::lane_sum;
using vmath512::valid;

// The largest of row[0..keys), and the smallest in lo (a NaN may be skipped in either: the
// exponentials carry it).
ETUDE_CPU_AVX512_TARGET inline float row_max(const float* row, index_t keys, float& lo) {
  const __m512 none = _mm512_set1_ps(-INFINITY);
  __m512 m = none, low = _mm512_set1_ps(INFINITY);
  for (index_t j = 0; j < keys; j += lanes) {
    const __mmask16 v = valid(j, keys);
    const __m512 x = _mm512_mask_loadu_ps(none, v, row + j);
    m = _mm512_maskz_max_ps(all, m, x);
    low = _mm512_mask_min_ps(low, v, low, x);
  }
  lo = -lane_max(_mm512_sub_ps(_mm512_setzero_ps(), low));
  return lane_max(m);
}

// e^x for every x ≥ normal_exponent is a normal float (e^-87 > 2^-126, within exp16's ulp), so
// a row whose exponentials' arguments all lie there has no subnormal probability to round.
inline constexpr float normal_exponent = -87.0f;

// e^(row[j] − shift) on the valid lanes of the vector at j, 0 on the masked ones.
ETUDE_CPU_AVX512_TARGET inline __m512 exponentials(const float* row, index_t j, __mmask16 m, __m512 shift) {
  return _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), shift)));
}

// The row's probabilities unnormalised, in place (Rounded: rounded into rb); returns their sum.
template <bool Rounded>
ETUDE_CPU_AVX512_TARGET inline float softmax(float* row, bf16* rb, index_t keys, float mx) {
  const __m512 shift = _mm512_set1_ps(mx);
  __m512 sum = _mm512_setzero_ps();
  for (index_t j = 0; j < keys; j += lanes) {
    const __m512 e = exponentials(row, j, valid(j, keys), shift);
    if constexpr (Rounded)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(rb + j), vmath512::round_to_bf16(e));
    else
      _mm512_storeu_ps(row + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  return lane_sum(sum);
}

// pr = e^(pr − lse) up to padded(keys) (0 on the masked lanes); returns Σ pr·dp.
ETUDE_CPU_AVX512_TARGET inline float probabilities(float* pr, const float* dp, index_t keys, float lse) {
  const __m512 shift = _mm512_set1_ps(lse);
  __m512 dot = _mm512_setzero_ps();
  for (index_t j = 0; j < keys; j += lanes) {
    const __mmask16 m = valid(j, keys);
    const __m512 e = exponentials(pr, j, m, shift);
    _mm512_storeu_ps(pr + j, e);
    dot = _mm512_fmadd_ps(e, _mm512_maskz_loadu_ps(m, dp + j), dot);
  }
  return lane_sum(dot);
}

// pr = e^(pr − lse) (0 on the masked lanes), then ds = pr·(dp − Σ pr·dp) (+0 on the masked lanes).
template <class D>
ETUDE_CPU_AVX512_TARGET inline void backward(float* pr, const float* dp, D* ds, index_t keys, float lse) {
  const __m512 total = _mm512_set1_ps(probabilities(pr, dp, keys, lse));
  for (index_t j = 0; j < keys; j += lanes) {
    const __mmask16 m = valid(j, keys);
    const __m512 dpj = _mm512_maskz_loadu_ps(m, dp + j);
    const __m512 g = _mm512_maskz_mul_ps(m, _mm512_loadu_ps(pr + j), _mm512_sub_ps(dpj, total));
    if constexpr (std::is_same_v<D, float>)
      _mm512_storeu_ps(ds + j, g);
    else
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds + j), vmath512::round_to_bf16(g));
  }
}

}  // namespace kernel

// The bf16 dot path's rounding (where tile_product::available()): two vectors at a time by
// tile_product::kernel::round_two (vcvtne2ps2bf16; a pair holding a subnormal float by
// round_to_bf16), half the instructions of rounding by integer arithmetic, in loops where a
// score's rounding cost as much as a third of its exponential.
namespace paired {

using tile_product::word;

// x0's 16 values rounded into the low 256 bits, x1's into the high ones.
using tile_product::kernel::round_two;

// The lanes of the vector at j below n, none once j ≥ n.
ETUDE_CPU_AVX512_BF16_TARGET inline __mmask16 below(index_t j, index_t n) {
  return j >= n ? __mmask16(0) : vmath512::valid(j, n);
}

// kernel::softmax<true> rounding two vectors at a time: the same sum, the same bits. Normal: the
// caller knows every exponential is normal or zero (the row's smallest score less mx is at least
// normal_exponent), so the pairs skip round_two's test for subnormals (vcvtne2ps2bf16 alone).
template <bool Normal>
ETUDE_CPU_AVX512_BF16_TARGET inline float softmax_rounded(const float* row, bf16* rb, index_t keys, float mx) {
  const __m512 shift = _mm512_set1_ps(mx);
  __m512 sum = _mm512_setzero_ps();
  index_t j = 0;
  for (; j + 2 * lanes <= padded(keys); j += 2 * lanes) {
    const __m512 e0 = kernel::exponentials(row, j, vmath512::valid(j, keys), shift);
    const __m512 e1 = kernel::exponentials(row, j + lanes, vmath512::valid(j + lanes, keys), shift);
    _mm512_storeu_si512(rb + j, Normal ? (__m512i)_mm512_cvtne2ps_pbh(e1, e0) : round_two(e0, e1));
    sum = _mm512_add_ps(_mm512_add_ps(sum, e0), e1);
  }
  if (j < keys) {
    const __m512 e = kernel::exponentials(row, j, vmath512::valid(j, keys), shift);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rb + j), vmath512::round_to_bf16(e));
    sum = _mm512_add_ps(sum, e);
  }
  return kernel::lane_sum(sum);
}
ETUDE_CPU_AVX512_BF16_TARGET inline float softmax(const float* row, bf16* rb, index_t keys, float mx,
                                                  bool normal = false) {
  return normal ? softmax_rounded<true>(row, rb, keys, mx) : softmax_rounded<false>(row, rb, keys, mx);
}

// Rows r (a) and r + 1 (b) of a block as backward() makes each: P from lse in pr, dS rounded into
// its row up to padded(cols); and their bf16 P and dS paired in words for keys j < cols, row r's
// in the low half (the layout that meets dO and Q). b.keys = 0: no row r + 1 (its halves are zero
// and b.ds is not written; b's pointers are a's).
ETUDE_CPU_AVX512_BF16_TARGET inline void backward_pair(backward_row a, backward_row b, word* pp, word* sp,
                                                       index_t cols) {
  alignas(64) static constexpr std::uint16_t interleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                               21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                               11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i order = _mm512_load_si512(interleave);
  const __m512 total_a = _mm512_set1_ps(kernel::probabilities(a.pr, a.dp, a.keys, a.lse));
  const __m512 total_b = _mm512_set1_ps(b.keys > 0 ? kernel::probabilities(b.pr, b.dp, b.keys, b.lse) : 0.0f);
  for (index_t j = 0; j < cols; j += lanes) {
    const __mmask16 ma = below(j, a.keys), mb = below(j, b.keys);
    const __m512 pa = _mm512_maskz_loadu_ps(ma, a.pr + j), pb = _mm512_maskz_loadu_ps(mb, b.pr + j);
    const __m512 ga = _mm512_maskz_mul_ps(ma, pa, _mm512_sub_ps(_mm512_maskz_loadu_ps(ma, a.dp + j), total_a));
    const __m512 gb = _mm512_maskz_mul_ps(mb, pb, _mm512_sub_ps(_mm512_maskz_loadu_ps(mb, b.dp + j), total_b));
    const __m512i p2 = round_two(pa, pb), s2 = round_two(ga, gb);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.ds + j), _mm512_maskz_extracti64x4_epi64(0xF, s2, 0));
    if (b.keys > 0)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.ds + j), _mm512_maskz_extracti64x4_epi64(0xF, s2, 1));
    const __mmask16 words = vmath512::valid(j, cols);
    _mm512_mask_storeu_epi32(pp + j, words, _mm512_permutexvar_epi16(order, p2));
    _mm512_mask_storeu_epi32(sp + j, words, _mm512_permutexvar_epi16(order, s2));
  }
}

}  // namespace paired

#else

namespace paired {
// Callers check tile_product::available() first; the declaration keeps their code one path on other CPUs.
inline void backward_pair(backward_row, backward_row, tile_product::word*, tile_product::word*, index_t) {
  throw error("cpu score_rows::paired::backward_pair: built for a CPU without AVX512_BF16; check available() first");
}
}  // namespace paired
#endif

}  // namespace etude::backend::cpu_detail::score_rows
