// Attention's score rows in float: the forward's softmax (a row's maximum, its exponentials and
// their sum, the log-sum-exp) and the backward's row terms (the probabilities again from the
// forward's log-sum-exp, their dot with dP, and dS = P·(dP − dot)). With a head dimension of 64
// a score costs as many instructions in its exponential as in its product, so these loops are as
// long as the products around them; on AVX-512 they run as kernels on vmath512's exponential (14
// instructions for 16 lanes, against the 37 GCC 12 makes of vexp), and the masked keys past
// a row's last valid one are lanes of a mask rather than values written first.
//
// Where the CPU has AVX512_BF16 (the bf16 dot path), `paired` rounds the bf16 rows two vectors at
// a time and forms the backward's paired words for two rows at once.
//
// Every row has `keys` valid entries followed by masked ones up to `width`; rows hold at least
// max(width, padded(keys)) entries (score_stride in cpu_attention). The results are the portable
// loops' to within the exponential's rounding (both within 1 ulp of e^x) and the order of the row
// sums' additions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "etude/backend/cpu/detail/bf16_pairs.hpp"
#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/backend/cpu/detail/vmath512.hpp"
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

#ifdef ETUDE_VMATH512

namespace kernel {

using vmath512::all;
using vmath512::exp16;
using vmath512::lane_max;
using vmath512::lane_sum;
using vmath512::valid;

// The largest of row[0..keys), and the smallest in lo (a NaN may be skipped in either: the
// exponentials carry it).
ETUDE_VMATH512_TARGET inline float row_max(const float* row, index_t keys, float& lo) {
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
ETUDE_VMATH512_TARGET inline __m512 exponentials(const float* row, index_t j, __mmask16 m, __m512 shift) {
  return _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), shift)));
}

// The row's probabilities unnormalised, in place (Rounded: rounded into rb); returns their sum.
template <bool Rounded>
ETUDE_VMATH512_TARGET inline float softmax(float* row, bf16* rb, index_t keys, float mx) {
  const __m512 shift = _mm512_set1_ps(mx);
  __m512 sum = _mm512_setzero_ps();
  for (index_t j = 0; j < keys; j += lanes) {
    const __m512 e = exponentials(row, j, valid(j, keys), shift);
    if constexpr (Rounded) _mm256_storeu_si256(reinterpret_cast<__m256i*>(rb + j), vmath512::round_to_bf16(e));
    else _mm512_storeu_ps(row + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  return lane_sum(sum);
}

// pr = e^(pr − lse) up to padded(keys) (0 on the masked lanes); returns Σ pr·dp.
ETUDE_VMATH512_TARGET inline float probabilities(float* pr, const float* dp, index_t keys, float lse) {
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
ETUDE_VMATH512_TARGET inline void backward(float* pr, const float* dp, D* ds, index_t keys, float lse) {
  const __m512 total = _mm512_set1_ps(probabilities(pr, dp, keys, lse));
  for (index_t j = 0; j < keys; j += lanes) {
    const __mmask16 m = valid(j, keys);
    const __m512 dpj = _mm512_maskz_loadu_ps(m, dp + j);
    const __m512 g = _mm512_maskz_mul_ps(m, _mm512_loadu_ps(pr + j), _mm512_sub_ps(dpj, total));
    if constexpr (std::is_same_v<D, float>) _mm512_storeu_ps(ds + j, g);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds + j), vmath512::round_to_bf16(g));
  }
}

}  // namespace kernel

#ifdef ETUDE_BF16_PAIRS

// The bf16 dot path's rounding (where bf16_pairs::available()): two vectors at a time by
// bf16_pairs::kernel::round_two (vcvtne2ps2bf16; a pair holding a subnormal float by
// round_to_bf16), half the instructions of rounding by integer arithmetic, in loops where a
// score's rounding cost as much as a third of its exponential.
namespace paired {

using bf16_pairs::word;

// x0's 16 values rounded into the low 256 bits, x1's into the high ones.
using bf16_pairs::kernel::round_two;

// The lanes of the vector at j below n, none once j ≥ n.
ETUDE_BF16_PAIRS_TARGET inline __mmask16 below(index_t j, index_t n) {
  return j >= n ? __mmask16(0) : vmath512::valid(j, n);
}

// kernel::softmax<true> rounding two vectors at a time: the same sum, the same bits. Normal: the
// caller knows every exponential is normal or zero (the row's smallest score less mx is at least
// normal_exponent), so the pairs skip round_two's test for subnormals (vcvtne2ps2bf16 alone).
template <bool Normal>
ETUDE_BF16_PAIRS_TARGET inline float softmax_rounded(const float* row, bf16* rb, index_t keys, float mx) {
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
ETUDE_BF16_PAIRS_TARGET inline float softmax(const float* row, bf16* rb, index_t keys, float mx, bool normal = false) {
  return normal ? softmax_rounded<true>(row, rb, keys, mx) : softmax_rounded<false>(row, rb, keys, mx);
}

// Rows r (a) and r + 1 (b) of a block as backward() makes each: P from lse in pr, dS rounded into
// its row up to padded(cols); and their bf16 P and dS paired in words for keys j < cols, row r's
// in the low half (the layout that meets dO and Q). b.keys = 0: no row r + 1 (its halves are zero
// and b.ds is not written; b's pointers are a's).
ETUDE_BF16_PAIRS_TARGET inline void backward_pair(backward_row a, backward_row b, word* pp, word* sp, index_t cols) {
  alignas(64) static constexpr std::uint16_t interleave[32] = {0, 16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
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

#endif

#endif

#ifndef ETUDE_BF16_PAIRS
namespace paired {
// Callers check bf16_pairs::available() first; the declaration keeps their code one path on other CPUs.
inline void backward_pair(backward_row, backward_row, bf16_pairs::word*, bf16_pairs::word*, index_t) {
  throw error("cpu score_rows::paired::backward_pair: built for a CPU without AVX512_BF16; check available() first");
}
}  // namespace paired
#endif

// One forward score row (keys valid entries of scores already scaled): the probabilities
// e^(s − max) unnormalised, in place in row (F) or rounded into rb (bf16), zero from `keys` up
// to `width`; their reciprocal sum in inv; returns the log-sum-exp. Without rb the row holds the
// probabilities; with it, row is left as scratch.
template <class F>
inline F softmax(F* row, bf16* rb, index_t keys, index_t width, F& inv) {
  const index_t whole = padded(keys);
#ifdef ETUDE_VMATH512
  if constexpr (std::is_same_v<F, float>) {
    if (vmath512::available()) {
      float lo = 0.0f;
      const float mx = kernel::row_max(row, keys, lo);
      float sum;
      if (rb == nullptr) sum = kernel::softmax<false>(row, rb, keys, mx);
#ifdef ETUDE_BF16_PAIRS
      else if (bf16_pairs::available()) sum = paired::softmax(row, rb, keys, mx, lo - mx >= kernel::normal_exponent);
#endif
      else sum = kernel::softmax<true>(row, rb, keys, mx);
      inv = 1.0f / sum;
      if (rb != nullptr) std::fill(rb + whole, rb + std::max(whole, width), bf16::from_bits(0));
      else std::fill(row + whole, row + std::max(whole, width), F(0.0));
      return mx + std::log(sum);
    }
  }
#endif
  // whole vectors: the masked keys up to there take −inf, e^−inf = 0, so that no loop takes a
  // scalar remainder (an exponential at a time)
  for (index_t j = keys; j < whole; ++j) row[j] = -F(INFINITY);
  const F mx = row_max(row, whole);
  F sum = F(0.0);
#pragma omp simd reduction(+ : sum)
  for (index_t j = 0; j < whole; ++j) {
    row[j] = vexp(row[j] - mx);
    sum += row[j];
  }
  if (rb != nullptr) {
    if constexpr (std::is_same_v<F, float>) {
#pragma omp simd
      for (index_t j = 0; j < whole; ++j) rb[j] = cv<bf16>(row[j]);
    }
    std::fill(rb + whole, rb + std::max(whole, width), bf16::from_bits(0));
  } else {
    std::fill(row + whole, row + std::max(whole, width), F(0.0));
  }
  inv = F(1.0) / sum;
  return mx + std::log(sum);
}

// One backward score row: pr holds the scaled scores of `keys` valid entries, dp the row of dO·Vᵀ.
// pr becomes the probabilities e^(s − lse) and ds (D: F in place over dp, or bf16) the scores'
// gradient P·(dP − Σ P·dP); both are zero from `keys` up to `width` (+0: a −0 from P·(dP − dot)
// at a masked key is overwritten).
template <class F, class D>
inline void backward(F* pr, F* dp, D* ds, index_t keys, index_t width, F lse) {
  const index_t whole = padded(keys);
#ifdef ETUDE_VMATH512
  if constexpr (std::is_same_v<F, float>) {
    if (vmath512::available()) {
      kernel::backward(pr, dp, ds, keys, lse);
      std::fill(pr + whole, pr + std::max(whole, width), F(0.0));
      std::fill(ds + whole, ds + std::max(whole, width), cv<D>(0.0f));
      return;
    }
  }
#endif
  for (index_t j = keys; j < whole; ++j) pr[j] = -F(INFINITY), dp[j] = F(0.0);
#pragma omp simd
  for (index_t j = 0; j < whole; ++j) pr[j] = vexp(pr[j] - lse);
  F dot = F(0.0);
#pragma omp simd reduction(+ : dot)
  for (index_t j = 0; j < whole; ++j) dot += pr[j] * dp[j];
#pragma omp simd
  for (index_t j = 0; j < whole; ++j) ds[j] = cv<D>(pr[j] * (dp[j] - dot));
  std::fill(pr + whole, pr + std::max(whole, width), F(0.0));
  std::fill(ds + keys, ds + std::max(whole, width), cv<D>(F(0.0)));
}

}  // namespace etude::backend::cpu_detail::score_rows
