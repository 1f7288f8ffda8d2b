// Elementwise transcendental functions written so that GCC and Clang vectorise the loops that
// call them (`#pragma omp simd`): glibc's expf only vectorises under -ffast-math, which etude
// never asks of its users. Accuracy is within 2 ulp of the correctly rounded result on the
// ranges the backend uses; tests compare against std:: versions.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace etude::backend::cpu_detail {

// c ? a : b, on the bits. GCC turns a float ?: inside a simd loop into a vector blend only with
// AVX-512's masked moves: on AVX2 and SSE targets (and so in any build without -march for an
// AVX-512 machine) a loop over the functions below stayed scalar, 8-15 ns an element. Both arms
// are computed anyway; an integer mask from the comparison vectorises on every target.
#pragma omp declare simd notinbranch
inline float select(bool c, float a, float b) {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<std::uint32_t>(a) & m) | (std::bit_cast<std::uint32_t>(b) & ~m));
}

// e^x by Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, and a degree-7 Taylor polynomial
// (truncation error r^8/8! < 5.2e-9, below half an ulp). 2^n is applied as two factors so that
// results near overflow and in the subnormal range stay right. 0 below -103.9 (under the least
// subnormal), +inf above 88.72.
#pragma omp declare simd notinbranch
inline float exp_cody_waite(float x) {
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693145751953125f;     // exactly representable: n * ln2_hi is exact
  constexpr float ln2_lo = 1.428606765330187e-06f;  // ln2 - ln2_hi
  // clamp with selects, not fminf/fmaxf: those do not vectorise, and they would turn NaN into a
  // number where a NaN must reach the loss check
  float xc = select(x < -103.9f, -103.9f, x);
  xc = select(xc > 88.72f, 88.72f, xc);
  xc = select(xc == xc, xc, 0.0f);  // NaN: keep the integer conversion below defined; NaN is returned
  // round to nearest by adding and removing 1.5·2^23 (GCC does not vectorise floorf without
  // -fno-trapping-math); valid for |x·log2e| < 2^22
  constexpr float round_magic = 12582912.0f;
  const float n = (xc * log2e + round_magic) - round_magic;
  const float r = (xc - n * ln2_hi) - n * ln2_lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const auto ni = static_cast<std::int32_t>(n);
  const std::int32_t half = ni >> 1;  // n = half + (n - half), both within [-75, 64]
  const float s1 = std::bit_cast<float>(static_cast<std::uint32_t>(half + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<std::uint32_t>(ni - half + 127) << 23);
  const float result = p * s1 * s2;
  return select(x < -103.9f, 0.0f, select(x > 88.72f, INFINITY, select(x == x, result, x)));
}

// erf(x) in float, vectorisable, within 3 ulp (tests/ops/elementwise.cpp checks it against libm).
// |x| < 1: x·(a0 + u·Q(u)) with u = x², Q of degree 5; 1 <= |x| < 4: 1 − e^(−x²)·R(1/|x|) with R
// of degree 9 (erfc(x)·e^(x²) is smooth in 1/x); |x| >= 4: ±1 (erfc(4) is below half an ulp of 1).
// Coefficients: weighted least-squares fits for relative error, made for etude (tools: numpy).
// erf_from takes e^(−x²), which the large branch needs, from its caller: GELU's backward has the
// same exponential in its density and computes it once for both.
#pragma omp declare simd notinbranch
inline float erf_from(float x, float gauss) {
  const float a = select(x < 0.0f, -x, x);
  const float u = a * a;
  float q = 7.898209878476337e-05f;
  q = q * u - 0.0008024353883229196f;
  q = q * u + 0.00519005348905921f;
  q = q * u - 0.026854809373617172f;
  q = q * u + 0.11283612251281738f;
  q = q * u - 0.3761262893676758f;
  const float small = a * 1.128379225730896f + a * (u * q);
  const float t = 1.0f / select(a < 1.0f, 1.0f, a);
  float b = 0.03206583485007286f;
  b = b * t - 0.18719515204429626f;
  b = b * t + 0.4562140107154846f;
  b = b * t - 0.5615038871765137f;
  b = b * t + 0.25932660698890686f;
  b = b * t + 0.2187654823064804f;
  b = b * t - 0.37169361114501953f;
  b = b * t + 0.019603915512561798f;
  b = b * t + 0.5618857145309448f;
  b = b * t + 0.00011466929572634399f;
  const float large = 1.0f - gauss * b;
  const float r = select(a < 1.0f, small, select(a >= 4.0f, 1.0f, large));  // NaN falls through to `large`
  return select(x < 0.0f, -r, r);
}
#pragma omp declare simd notinbranch
inline float erf_poly(float x) { return erf_from(x, exp_cody_waite(-(x * x))); }

// The backend's exponential: the vectorisable float kernel above, libm in double (the double
// instantiation is the gradient-check oracle, where speed does not matter).
#pragma omp declare simd notinbranch
inline float vexp(float x) { return exp_cody_waite(x); }
inline double vexp(double x) { return std::exp(x); }
#pragma omp declare simd notinbranch
inline float verf(float x) { return erf_poly(x); }
inline double verf(double x) { return std::erf(x); }

// The largest of x[0..n), n ≥ 1, kept in 16 independent lanes. GCC 12 leaves a loop under
// `omp simd reduction(max: m)` scalar, a chain of dependent maxima at 2-3 cycles an element: 20% of
// bf16 attention's forward outside its products. Maxima are exact, so the result is the same in
// any order (for rows without NaN; a NaN in x is skipped, or returned when it is x[0]).
inline float row_max(const float* x, std::int64_t n) {
  constexpr int lanes = 16;
  float m[lanes];
  for (int l = 0; l < lanes; ++l) m[l] = x[0];
  std::int64_t j = 0;
  for (; j + lanes <= n; j += lanes) {
#pragma omp simd
    for (int l = 0; l < lanes; ++l) m[l] = select(x[j + l] > m[l], x[j + l], m[l]);
  }
  for (; j < n; ++j) m[0] = select(x[j] > m[0], x[j], m[0]);
  float r = m[0];
  for (int l = 1; l < lanes; ++l) r = select(m[l] > r, m[l], r);
  return r;
}
inline double row_max(const double* x, std::int64_t n) {
  double r = x[0];
  for (std::int64_t j = 1; j < n; ++j) r = x[j] > r ? x[j] : r;
  return r;
}

// x[i] = sqrt(x[i]) for n values, correctly rounded (the instruction std::sqrt uses). A loop that
// calls std::sqrt stays scalar unless the program is built with -fno-math-errno (GCC keeps a call
// to sqrtf for negative inputs, to set errno), which etude does not ask of its users: AdamW's
// update took 4.6x as long. A negative value gives NaN, as std::sqrt does.
inline void sqrt_in_place(float* x, std::int64_t n) {
  std::int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
#elif defined(__AVX__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#elif defined(__SSE2__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}
inline void sqrt_in_place(double* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = std::sqrt(x[i]);
}

}  // namespace etude::backend::cpu_detail
