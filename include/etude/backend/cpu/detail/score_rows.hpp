// Attention's score rows in float: the forward's softmax (a row's maximum, its exponentials and
// their sum, the log-sum-exp) and the backward's row terms (the probabilities again from the
// forward's log-sum-exp, their dot with dP, and dS = P·(dP − dot)). With a head dimension of 64
// a score costs as many instructions in its exponential as in its product, so these loops are as
// long as the products around them; on AVX-512 they run as kernels on vmath512's exponential (14
// instructions for 16 lanes, against the 37 GCC 12 makes of vexp), and the masked keys past
// a row's last valid one are lanes of a mask rather than values written first.
//
// Every row has `keys` valid entries followed by masked ones up to `width`; rows hold at least
// max(width, padded(keys)) entries (score_stride in cpu_attention). The results are the portable
// loops' to within the exponential's rounding (both within 1 ulp of e^x) and the order of the row
// sums' additions.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/backend/cpu/detail/vmath512.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/types.hpp"

namespace etude::backend::cpu_detail::score_rows {

using vmath512::lanes;
using vmath512::padded;

#ifdef ETUDE_VMATH512

namespace kernel {

using vmath512::all;
using vmath512::exp16;
using vmath512::lane_max;
using vmath512::lane_sum;
using vmath512::valid;

// The largest of row[0..keys) (a NaN may be skipped: the exponentials carry it).
ETUDE_VMATH512_TARGET inline float row_max(const float* row, index_t keys) {
  const __m512 none = _mm512_set1_ps(-INFINITY);
  __m512 m = none;
  for (index_t j = 0; j < keys; j += lanes)
    m = _mm512_maskz_max_ps(all, m, _mm512_mask_loadu_ps(none, valid(j, keys), row + j));
  return lane_max(m);
}

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

// pr = e^(pr − lse) (0 on the masked lanes), then ds = pr·(dp − Σ pr·dp) (+0 on the masked lanes).
template <class D>
ETUDE_VMATH512_TARGET inline void backward(float* pr, const float* dp, D* ds, index_t keys, float lse) {
  const __m512 shift = _mm512_set1_ps(lse);
  __m512 dot = _mm512_setzero_ps();
  for (index_t j = 0; j < keys; j += lanes) {
    const __mmask16 m = valid(j, keys);
    const __m512 e = exponentials(pr, j, m, shift);
    _mm512_storeu_ps(pr + j, e);
    dot = _mm512_fmadd_ps(e, _mm512_maskz_loadu_ps(m, dp + j), dot);
  }
  const __m512 total = _mm512_set1_ps(lane_sum(dot));
  for (index_t j = 0; j < keys; j += lanes) {
    const __mmask16 m = valid(j, keys);
    const __m512 dpj = _mm512_maskz_loadu_ps(m, dp + j);
    const __m512 g = _mm512_maskz_mul_ps(m, _mm512_loadu_ps(pr + j), _mm512_sub_ps(dpj, total));
    if constexpr (std::is_same_v<D, float>) _mm512_storeu_ps(ds + j, g);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds + j), vmath512::round_to_bf16(g));
  }
}

}  // namespace kernel

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
      const float mx = kernel::row_max(row, keys);
      const float sum =
          rb != nullptr ? kernel::softmax<true>(row, rb, keys, mx) : kernel::softmax<false>(row, rb, keys, mx);
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
