// __half and __nv_bfloat16 under the CUDA simulator: 16 bits of storage, conversions from float
// rounded to nearest even as the sm_80+ cvt.rn instructions do (NaN becomes the canonical NaN
// 0x7fff, overflow rounds to infinity, fp16 keeps subnormals), widening exact; arithmetic in float,
// rounded once. Not for: the paired types (__half2, __nv_bfloat162), which etude does not use.
#pragma once

#include <cstdint>
#include <cstring>

namespace etude::cuda_sim::detail {

inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t float_to_bf16_rn(float f) {
  const std::uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  const std::uint32_t lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);  // carries into the exponent: up to infinity
}
inline float bf16_to_float(std::uint16_t h) { return float_of(static_cast<std::uint32_t>(h) << 16); }

inline std::uint16_t float_to_half_rn(float f) {
  const std::uint32_t u = bits_of(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fff;
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // at or above 65520: rounds to infinity
  if (a >= 0x38800000u) {                        // normal in fp16 (2^-14 and up)
    const std::uint32_t lsb = (a >> 13) & 1u;
    return sign | static_cast<std::uint16_t>((a - 0x38000000u + 0xfffu + lsb) >> 13);
  }
  if (a < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): zero
  // subnormal: the significand with its implicit bit, shifted so one unit is 2^-24, rounded to even
  const std::uint32_t exp = a >> 23, mant = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126 - exp;  // 2^(exp-127) · mant/2^23 in units of 2^-24
  const std::uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  const std::uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
  return sign | static_cast<std::uint16_t>(r);
}
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return float_of(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return float_of(sign | ((exp + 112) << 23) | (mant << 13));
  // zero or subnormal: mant · 2^-24, exact in float
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign != 0 ? -v : v;
}

}  // namespace etude::cuda_sim::detail

struct __half_raw {
  unsigned short x;
};
struct __nv_bfloat16_raw {
  unsigned short x;
};

struct alignas(2) __half {
  unsigned short __x = 0;
  __half() = default;
  __half(const __half_raw& r) : __x(r.x) {}
  __half(float f) : __x(etude::cuda_sim::detail::float_to_half_rn(f)) {}
  __half(double d) : __half(static_cast<float>(d)) {}
  __half(int i) : __half(static_cast<float>(i)) {}
  operator float() const { return etude::cuda_sim::detail::half_to_float(__x); }
  operator __half_raw() const { return {__x}; }
};

struct alignas(2) __nv_bfloat16 {
  unsigned short __x = 0;
  __nv_bfloat16() = default;
  __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(etude::cuda_sim::detail::float_to_bf16_rn(f)) {}
  __nv_bfloat16(double d) : __nv_bfloat16(static_cast<float>(d)) {}
  __nv_bfloat16(int i) : __nv_bfloat16(static_cast<float>(i)) {}
  operator float() const { return etude::cuda_sim::detail::bf16_to_float(__x); }
  operator __nv_bfloat16_raw() const { return {__x}; }
};
using nv_bfloat16 = __nv_bfloat16;
using half = __half;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
inline __half __ushort_as_half(unsigned short u) { return __half_raw{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16_raw{u}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }

// Arithmetic as the device's: in float, rounded once to the type.
#define ETUDE_CUDA_SIM_HALF_OPS(T)                                                              \
  inline T operator+(T a, T b) { return T(static_cast<float>(a) + static_cast<float>(b)); }     \
  inline T operator-(T a, T b) { return T(static_cast<float>(a) - static_cast<float>(b)); }     \
  inline T operator*(T a, T b) { return T(static_cast<float>(a) * static_cast<float>(b)); }     \
  inline T operator/(T a, T b) { return T(static_cast<float>(a) / static_cast<float>(b)); }     \
  inline T operator-(T a) { return T(-static_cast<float>(a)); }                                 \
  inline bool operator==(T a, T b) { return static_cast<float>(a) == static_cast<float>(b); }   \
  inline bool operator!=(T a, T b) { return static_cast<float>(a) != static_cast<float>(b); }   \
  inline bool operator<(T a, T b) { return static_cast<float>(a) < static_cast<float>(b); }     \
  inline bool operator>(T a, T b) { return static_cast<float>(a) > static_cast<float>(b); }     \
  inline bool operator<=(T a, T b) { return static_cast<float>(a) <= static_cast<float>(b); }   \
  inline bool operator>=(T a, T b) { return static_cast<float>(a) >= static_cast<float>(b); }
ETUDE_CUDA_SIM_HALF_OPS(__half)
ETUDE_CUDA_SIM_HALF_OPS(__nv_bfloat16)
#undef ETUDE_CUDA_SIM_HALF_OPS
