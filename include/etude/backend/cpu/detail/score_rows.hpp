// Attention's score rows in float: the forward's softmax (a row's maximum, its exponentials and
// their sum, the log-sum-exp) and the backward's row terms (the probabilities again from the
// forward's log-sum-exp, their dot with dP, and dS = P·(dP − dot)): the portable loops, and the
// dispatch to the AVX-512 kernels (kernels/avx512_score_rows.hpp) where the CPU has them. Not the
// kernels themselves.
//
// Every row has `keys` valid entries followed by masked ones up to `width`; rows hold at least
// max(width, padded(keys)) entries (score_stride in cpu_attention). The kernels' results are the
// portable loops' to within the exponential's rounding (both within 1 ulp of e^x) and the order of
// the row sums' additions.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/backend/cpu/kernels/avx512_score_rows.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/types.hpp"

namespace etude::backend::cpu_detail::score_rows {

using vmath512::padded;

// softmax (below) as the portable loops, on any CPU.
template <class Compute>
inline Compute softmax_portable(Compute* row, bf16* rb, index_t keys, index_t width, Compute& inv) {
  const index_t whole = padded(keys);
  // whole vectors: the masked keys up to there take −inf, e^−inf = 0, so that no loop takes a
  // scalar remainder (an exponential at a time)
  for (index_t j = keys; j < whole; ++j) row[j] = -Compute(INFINITY);
  const Compute mx = row_max(row, whole);
  Compute sum = Compute(0.0);
#pragma omp simd reduction(+ : sum)
  for (index_t j = 0; j < whole; ++j) {
    row[j] = vexp(row[j] - mx);
    sum += row[j];
  }
  if (rb != nullptr) {
    if constexpr (std::is_same_v<Compute, float>) {
#pragma omp simd
      for (index_t j = 0; j < whole; ++j) rb[j] = convert<bf16>(row[j]);
    }
    std::fill(rb + whole, rb + std::max(whole, width), bf16::from_bits(0));
  } else {
    std::fill(row + whole, row + std::max(whole, width), Compute(0.0));
  }
  inv = Compute(1.0) / sum;
  return mx + std::log(sum);
}

// One forward score row (keys valid entries of scores already scaled): the probabilities
// e^(s − max) unnormalised, in place in row (Compute) or rounded into rb (bf16), zero from `keys` up
// to `width`; their reciprocal sum in inv; returns the log-sum-exp. Without rb the row holds the
// probabilities; with it, row is left as scratch.
template <class Compute>
inline Compute softmax(Compute* row, bf16* rb, index_t keys, index_t width, Compute& inv) {
#ifdef ETUDE_CPU_X86_KERNELS
  if constexpr (std::is_same_v<Compute, float>) {
    if (vmath512::available()) {
      const index_t whole = padded(keys);
      float lo = 0.0f;
      const float mx = kernel::row_max(row, keys, lo);
      float sum;
      if (rb == nullptr) sum = kernel::softmax<false>(row, rb, keys, mx);
      else if (tile_product::available())
        sum = paired::softmax(row, rb, keys, mx, lo - mx >= kernel::normal_exponent);
      else sum = kernel::softmax<true>(row, rb, keys, mx);
      inv = 1.0f / sum;
      if (rb != nullptr) std::fill(rb + whole, rb + std::max(whole, width), bf16::from_bits(0));
      else
        std::fill(row + whole, row + std::max(whole, width), Compute(0.0));
      return mx + std::log(sum);
    }
  }
#endif
  return softmax_portable(row, rb, keys, width, inv);
}

// backward (below) as the portable loops, on any CPU.
template <class Compute, class D>
inline void backward_portable(Compute* pr, Compute* dp, D* ds, index_t keys, index_t width, Compute lse) {
  const index_t whole = padded(keys);
  for (index_t j = keys; j < whole; ++j) pr[j] = -Compute(INFINITY), dp[j] = Compute(0.0);
#pragma omp simd
  for (index_t j = 0; j < whole; ++j) pr[j] = vexp(pr[j] - lse);
  Compute dot = Compute(0.0);
#pragma omp simd reduction(+ : dot)
  for (index_t j = 0; j < whole; ++j) dot += pr[j] * dp[j];
#pragma omp simd
  for (index_t j = 0; j < whole; ++j) ds[j] = convert<D>(pr[j] * (dp[j] - dot));
  std::fill(pr + whole, pr + std::max(whole, width), Compute(0.0));
  std::fill(ds + keys, ds + std::max(whole, width), convert<D>(Compute(0.0)));
}

// One backward score row: pr holds the scaled scores of `keys` valid entries, dp the row of dO·Vᵀ.
// pr becomes the probabilities e^(s − lse) and ds (D: Compute in place over dp, or bf16) the scores'
// gradient P·(dP − Σ P·dP); both are zero from `keys` up to `width` (+0: a −0 from P·(dP − dot)
// at a masked key is overwritten).
template <class Compute, class D>
inline void backward(Compute* pr, Compute* dp, D* ds, index_t keys, index_t width, Compute lse) {
#ifdef ETUDE_CPU_X86_KERNELS
  if constexpr (std::is_same_v<Compute, float>) {
    if (vmath512::available()) {
      const index_t whole = padded(keys);
      kernel::backward(pr, dp, ds, keys, lse);
      std::fill(pr + whole, pr + std::max(whole, width), Compute(0.0));
      std::fill(ds + whole, ds + std::max(whole, width), convert<D>(0.0f));
      return;
    }
  }
#endif
  backward_portable(pr, dp, ds, keys, width, lse);
}

}  // namespace etude::backend::cpu_detail::score_rows
