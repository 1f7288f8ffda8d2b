// AVX-512 forms of vmath's float kernels, for the loops where an exponential is most of the work
// (attention's score rows, the heads' softmax cross-entropy): compiled for AVX-512 Compute, BW and VL
// whatever the program's flags (a target attribute) and taken where available() says the CPU has
// them, with vmath's portable loops elsewhere. GCC 12 makes 37 instructions of vexp for 16
// lanes (clamps, two factors of 2^n, NaN and range selects); exp16 takes 14, vscalefps applying
// 2^n with underflow, overflow and NaN in one correctly rounded step.
// (The all-lanes masked forms below: GCC 12's unmasked vmaxps, vminps, vscalefps and lane
// extractions start from an "undefined" register that -Wuninitialized reports, as in tile_product.)
#pragma once

#include <cmath>
#include <type_traits>

#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/backend/cpu/kernels/isa.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::backend::cpu_detail::vmath512 {

inline constexpr index_t lanes = 16;  // floats in a zmm register
inline constexpr index_t padded(index_t n) { return (n + lanes - 1) / lanes * lanes; }

// e^r ≈ 1 + r + r²/2 + r³·(c3 + c4·r + c5·r² + c6·r³) on |r| ≤ ln2/2, c3..c6 fitted for the least
// largest relative error (3.6e-9, against e^r's Taylor terms to r⁷'s 5.6e-9): one multiply-add
// fewer than exp_taylor7. exp16 with it is within 0.87 ulp of e^x over 60M arguments (0.91 with
// the Taylor terms).
inline constexpr float exp_minimax6[4] = {0.16666533052921295f, 0.041667237877845764f, 0.008367514237761497f,
                                          0.0013863758649677038f};

#ifdef ETUDE_CPU_X86_KERNELS

inline bool available() { return isa::avx512(); }

inline constexpr __mmask16 all = 0xFFFF;

// The lanes of the vector at j that lie below n.
ETUDE_CPU_AVX512_TARGET inline __mmask16 valid(index_t j, index_t n) {
  return n - j >= lanes ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1u);
}

// e^x on 16 lanes for x below 2^21, NaN or −inf: Cody-Waite reduction x = n ln2 + r as vexp's, the
// polynomial exp_minimax6, then p·2^n in one correctly rounded step. x is raised to -120 first
// (NaN passes: vmaxps returns its second operand when either is NaN); 2^n·p is 0 below e^-103.97
// and +inf above 88.73. Not clamped above (one instruction fewer; attention's forward float score
// rows take 0.81 cycles of the time-stamp counter a score, a 2-core AVX512_BF16 CPU, model not recorded:
// `build/bench/cpu_kernels --kernel score_rows_avx512`): every caller's x is a value less its
// row's maximum or log-sum-exp, at most a rounding above 0, and the reduction holds to 2^21
// (+inf would come out NaN). Within 1 ulp of e^x where vexp is (tests/ops/attention.cpp).
ETUDE_CPU_AVX512_TARGET inline __m512 exp16(__m512 x) {
  const __m512 xc = _mm512_maskz_max_ps(all, _mm512_set1_ps(-120.0f), x);
  const __m512 magic = _mm512_set1_ps(round_magic);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(log2e), magic), magic);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_hi), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_lo), r);
  __m512 p = _mm512_set1_ps(exp_minimax6[3]);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_minimax6[2]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_minimax6[1]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(exp_minimax6[0]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(all, p, n);
}

// The sum and the maximum of 16 lanes, in a fixed order: halves, quarters, pairs, neighbours.
ETUDE_CPU_AVX512_TARGET inline float lane_sum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(all, v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(all, v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(all, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(all, v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_cvtss_f32(v);
}
ETUDE_CPU_AVX512_TARGET inline float lane_max(__m512 v) {
  v = _mm512_maskz_max_ps(all, v, _mm512_maskz_shuffle_f32x4(all, v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_maskz_max_ps(all, v, _mm512_maskz_shuffle_f32x4(all, v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  v = _mm512_maskz_max_ps(all, v, _mm512_maskz_permute_ps(all, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_maskz_max_ps(all, v, _mm512_maskz_permute_ps(all, v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_cvtss_f32(v);
}

// 16 values from x[j..) on the lanes of m as floats (0 elsewhere): float, or bf16 widened.
ETUDE_CPU_AVX512_TARGET inline __m512 load(const float* x, __mmask16 m) { return _mm512_maskz_loadu_ps(m, x); }
ETUDE_CPU_AVX512_TARGET inline __m512 load(const bf16* x, __mmask16 m) {
  const __m512i wide = _mm512_maskz_cvtepu16_epi32(m, _mm256_maskz_loadu_epi16(m, x));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(all, wide, 16));
}

// 16 floats rounded to bf16 bits as bf16(float) rounds them: to nearest even, NaN kept and quietened.
ETUDE_CPU_AVX512_TARGET inline __m256i round_to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i kept = _mm512_maskz_srli_epi32(all, u, 16);
  const __m512i up =
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), _mm512_and_si512(kept, _mm512_set1_epi32(1)));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i r = _mm512_mask_or_epi32(_mm512_maskz_srli_epi32(all, up, 16), nan, kept, _mm512_set1_epi32(0x40));
  return _mm512_maskz_cvtepi32_epi16(all, r);
}

// e^(x[j] − shift) into out[j] for j < n (out may be x, or null for the sum alone); returns their
// sum, added lane by lane in order and then across the lanes (lane_sum): the same bits with or
// without out.
template <class T>
ETUDE_CPU_AVX512_TARGET inline float exp_sum(const T* x, float* out, index_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (index_t j = 0; j < n; j += lanes) {
    const __mmask16 m = valid(j, n);
    const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(load(x + j, m), s)));
    if (out != nullptr) _mm512_mask_storeu_ps(out + j, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  return lane_sum(sum);
}

#else

inline bool available() { return false; }

// Callers check available() first; the declaration keeps their code one path on other CPUs.
template <class T>
float exp_sum(const T*, float*, index_t, float) {
  throw error("cpu vmath512::exp_sum: built for a CPU without AVX-512; check available() first");
}

#endif

}  // namespace etude::backend::cpu_detail::vmath512
