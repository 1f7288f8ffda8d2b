// Elementwise transcendental functions written so that GCC and Clang vectorise the loops that
// call them (`#pragma omp simd`): glibc's expf only vectorises under -ffast-math, which etude
// never asks of its users. Accuracy is within 2 ulp of the correctly rounded result on the
// ranges the backend uses; tests compare against std:: versions.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace etude::backend::cpu_detail {

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
  float xc = x < -103.9f ? -103.9f : x;
  xc = xc > 88.72f ? 88.72f : xc;
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
  return x < -103.9f ? 0.0f : (x > 88.72f ? INFINITY : result);
}

// The backend's exponential: the vectorisable float kernel above, libm in double (the double
// instantiation is the gradient-check oracle, where speed does not matter).
#pragma omp declare simd notinbranch
inline float vexp(float x) { return exp_cody_waite(x); }
inline double vexp(double x) { return std::exp(x); }

}  // namespace etude::backend::cpu_detail
