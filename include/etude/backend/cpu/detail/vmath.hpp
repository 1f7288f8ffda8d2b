// Elementwise transcendental functions written so that GCC and Clang vectorise the loops that
// call them (`#pragma omp simd`): glibc's expf only vectorises under -ffast-math, which etude
// never asks of its users. Each states its accuracy on the ranges the backend uses; tests compare
// against std:: versions.
#pragma once

#include <algorithm>
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

// The exponentials' reduction x = n ln2 + r: n·ln2_hi is exact for the n they meet; rounding to
// an integer adds and removes 1.5·2^23 (GCC does not vectorise floorf without -fno-trapping-math),
// valid for |x·log2e| < 2^22.
inline constexpr float log2e = 1.44269504088896341f;
inline constexpr float ln2_hi = 0.693145751953125f;
inline constexpr float ln2_lo = 1.428606765330187e-06f;  // ln2 - ln2_hi
inline constexpr float round_magic = 12582912.0f;

// e^r for the reduced |r| <= ln2/2 (+ 0.05): Taylor to degree 7, truncation r^8/8! below 0.3 ulp.
#pragma omp declare simd notinbranch
inline float exp_taylor7(float r) {
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  return p * r + 1.0f;
}

// e^x by Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, and exp_taylor7. 2^n is applied as two
// factors so that results near overflow and in the subnormal range stay right. 0 below -103.9
// (under the least subnormal), +inf above 88.72.
#pragma omp declare simd notinbranch
inline float exp_cody_waite(float x) {
  // clamp with selects, not fminf/fmaxf: those do not vectorise, and they would turn NaN into a
  // number where a NaN must reach the loss check
  float xc = select(x < -103.9f, -103.9f, x);
  xc = select(xc > 88.72f, 88.72f, xc);
  xc = select(xc == xc, xc, 0.0f);  // NaN: keep the integer conversion below defined; NaN is returned
  const float n = (xc * log2e + round_magic) - round_magic;
  const float p = exp_taylor7((xc - n * ln2_hi) - n * ln2_lo);
  const auto ni = static_cast<std::int32_t>(n);
  const std::int32_t half = ni >> 1;  // n = half + (n - half), both within [-75, 64]
  const float s1 = std::bit_cast<float>(static_cast<std::uint32_t>(half + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<std::uint32_t>(ni - half + 127) << 23);
  const float result = p * s1 * s2;
  return select(x < -103.9f, 0.0f, select(x > 88.72f, INFINITY, select(x == x, result, x)));
}

// The normal distribution's density and tail in float, vectorisable, for GELU's x·Φ(x) and its
// derivative Φ(x) + x·φ(x): Φ(x) is the tail Q(|x|) = ½·erfc(|x|/√2) for x < 0 and 1 − Q(|x|) for
// x >= 0, so that it keeps its relative accuracy where it is small (1 + erf(x/√2) loses it).
//
// gauss(x) = e^(−x²/2) within 1.5 ulp; 0 once it is below 2^-124 (|x| > 13.11); any finite value
// for NaN (the callers multiply by x, which carries the NaN). x is split as xh + xl, xh of 12
// significant bits, so that xh² is exact and the part −xh·xl − xl²/2 joins the reduced argument of
// the exponential: e^(−x²/2) of x² rounded to float is up to 64 ulp off (at |x| = 11.66).
#pragma omp declare simd notinbranch
inline float gauss(float x) {
  const float xh = std::bit_cast<float>(std::bit_cast<std::uint32_t>(x) & 0xfffff000u);
  const float xl = x - xh;
  const float h = -0.5f * (xh * xh);  // exact
  const float l = -(xl * (xh + 0.5f * xl));
  const float hc = select(h > -86.0f, h, -86.0f);  // n >= -125: 2^n·p stays a normal number
  const float k = hc * log2e + round_magic;         // k's low bits hold n
  const float n = k - round_magic;
  const float p = exp_taylor7(((hc - n * ln2_hi) - n * ln2_lo) + l);  // |r| <= ln2/2 + 0.05
  const float e = std::bit_cast<float>(std::bit_cast<std::uint32_t>(p) + (std::bit_cast<std::uint32_t>(k) << 23));
  return select(h > -86.0f, e, 0.0f);
}

// Q(|x|) = ½·erfc(|x|/√2) given g = gauss(x), within 7 ulp (tests/ops/elementwise.cpp checks both
// against libm). erfc(a)·e^(a²) is smooth in t = 1/(1 + 0.375·a) on the whole of (0, 1]: R(t) of
// degree 8, a weighted least-squares fit for relative error (0.25 ulp; made for etude with numpy),
// gives Q = ½·g·t·R(t) with one division and no branch.
#pragma omp declare simd notinbranch
inline float normal_tail(float x, float g) {
  const float a = select(x < 0.0f, -x, x);
  const float t = 1.0f / (1.0f + 0.26516504294495535f * a);  // 0.375/√2: a is |x|/√2
  float r = 6.099576752e-02f;
  r = r * t - 2.847702930e-01f;
  r = r * t + 4.272675693e-01f;
  r = r * t - 2.237160952e-01f;
  r = r * t + 2.699006455e-01f;
  r = r * t + 1.230903130e-01f;
  r = r * t + 2.049178215e-01f;
  r = r * t + 2.107039129e-01f;
  r = r * t + 2.116103486e-01f;
  return 0.5f * g * (t * r);
}

// Φ(x) from the tail: see above.
#pragma omp declare simd notinbranch
inline float normal_cdf(float x, float g) {
  const float q = normal_tail(x, g);
  return select(x < 0.0f, q, 1.0f - q);
}

// The backend's exponential: the vectorisable float kernel above, libm in double (the double
// instantiation is the gradient-check oracle, where speed does not matter).
#pragma omp declare simd notinbranch
inline float vexp(float x) { return exp_cody_waite(x); }
inline double vexp(double x) { return std::exp(x); }

// The largest of x[0..n), n ≥ 1. GCC vectorises `omp simd reduction(max)` when the maximum is
// taken of a value (std::max(m, float(x[j]))), not of a reference into x: the form that bound
// its result to x[j] stayed a scalar chain at 2-3 cycles an element, and 16 lanes kept in an
// array went through memory (6x this loop's time on bf16 attention's score rows). Maxima are
// exact, so the result is the same in any order for rows without NaN; a NaN may be skipped (the
// exponentials that follow carry it).
inline float row_max(const float* x, std::int64_t n) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (std::int64_t j = 0; j < n; ++j) m = std::max(m, float(x[j]));  // from 0: aligned as x is
  return m;
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
