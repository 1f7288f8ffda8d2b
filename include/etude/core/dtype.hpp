// The 16-bit floating-point storage types of mixed precision, bf16 and fp16, with exact
// round-to-nearest-even conversions between them, float and double, one value at a time
// (`convert<To>(x)`) or over an array (`convert(dst, src, n)`, OpenMP-parallel and vectorised).
// Their bits are those of CUDA's __nv_bfloat16 and __half (2 bytes, 2-byte aligned, same
// encoding), so a buffer of either can be copied to or from the device and reinterpreted.
// Rounding is integer arithmetic on the source's bits (float operations appear only where they are
// exact or truncate), so it is the same at compile time and whatever the rounding mode or
// denormal flags; only from double does it add two hardware conversions, which flush-to-zero
// (never set by etude) would upset for results below 2^-126.
// Not for: arithmetic. The types have no operators; compute is float, and a value is widened
// with `static_cast<float>(x)` (exact) and narrowed again with `bf16(f)` / `convert<bf16>(f)`.
//
// Equality: there is no operator==. Comparing bits would make +0 != -0 and a NaN equal to
// itself; comparing as float would hide which encoding was stored, which is what a storage
// type's tests care about. Compare `static_cast<float>(a) == static_cast<float>(b)` for values
// and `same_bits(a, b)` for encodings.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "etude/core/types.hpp"

#if defined(_OPENMP)
#define ETUDE_DTYPE_PRAGMA(x) _Pragma(#x)
#else
#define ETUDE_DTYPE_PRAGMA(x)
#endif
// The per-element conversions must be inlined into the array loop for it to vectorise; at -O2
// GCC's heuristics would leave the fp16 ones out of line.
#if defined(__GNUC__)
#define ETUDE_DTYPE_INLINE [[gnu::always_inline]] inline
#else
#define ETUDE_DTYPE_INLINE inline
#endif

namespace etude {

namespace detail {

// float -> bfloat16 bits, round to nearest even. Adding 0x7fff plus the lowest kept bit carries
// into the kept half exactly when the dropped half is above one half, or exactly one half with an
// odd kept half. A carry out of the significand bumps the exponent: that is how values at or past
// the midpoint between the largest bf16 and 2^128 become infinity, and how the largest subnormals
// become the smallest normal. NaN is truncated and quietened instead, since the carry could turn
// it into infinity (0x7f800001 -> 0x7f80) or into a zero (0x7fffffff -> 0x8000).
ETUDE_DTYPE_INLINE constexpr std::uint16_t float_to_bf16_bits(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (u >> 16) | 0x0040u;
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<std::uint16_t>(is_nan ? nan : rounded);
}

ETUDE_DTYPE_INLINE constexpr float bf16_bits_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// float -> IEEE binary16 bits, round to nearest even, straight from the float's bits (one
// rounding, so no double-rounding trap). All three ranges are computed and one is selected, which
// keeps the loop over an array free of branches.
ETUDE_DTYPE_INLINE constexpr std::uint16_t float_to_fp16_bits(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;

  // Normal range, |f| >= 2^-14: rebias the exponent (127 -> 15, i.e. subtract 112 << 23) and
  // round the 13 dropped bits as above. From 65520 (midpoint of 65504 and 2^16) on, the result
  // reaches 0x7c00 or beyond and is clamped to infinity. Below the range this wraps; unused then.
  const std::uint32_t normal = (a - (112u << 23) + 0x0fffu + ((a >> 13) & 1u)) >> 13;
  const std::uint32_t finite = normal < 0x7c00u ? normal : 0x7c00u;

  // Subnormal range, |f| < 2^-14: the result counts units of 2^-24. Scaled by 2^38 (exact) the
  // value is below 2^24, and truncating it to an integer w (exact too, whatever the rounding mode)
  // keeps every bit down to 2^-38: w >> 14 is the truncated result, bit 13 the rounding bit, bits
  // 12..0 and what the truncation dropped (a float below 2^-15 has bits under 2^-38) the sticky
  // bit. Inputs outside the range are replaced by 0 first, so the conversion is always defined;
  // so are float subnormals, which round to zero anyway and would slow the multiplication down.
  const std::uint32_t is_subnormal = 0u - static_cast<std::uint32_t>(a < 0x38800000u);
  const std::uint32_t is_scaled = 0u - static_cast<std::uint32_t>(a - 0x00800000u < 0x38000000u);
  const float small = std::bit_cast<float>(a & is_scaled);
  const float scaled = small * 0x1p38f;
  const auto w_signed = static_cast<std::int32_t>(scaled);
  const auto w = static_cast<std::uint32_t>(w_signed);
  const std::uint32_t truncated =
      std::bit_cast<std::uint32_t>(static_cast<float>(w_signed)) != std::bit_cast<std::uint32_t>(scaled);
  const std::uint32_t kept = w >> 14;
  const std::uint32_t sticky = static_cast<std::uint32_t>((w & 0x1fffu) != 0u) | truncated;
  // Rounding the largest subnormal up gives 0x400, the smallest normal: the encoding carries.
  const std::uint32_t subnormal = kept + ((w >> 13) & 1u & (sticky | (kept & 1u)));

  // NaN: keep the top payload bits, set the quiet bit (never rounded into infinity).
  const std::uint32_t nan = 0x7e00u | ((a >> 13) & 0x03ffu);
  // The subnormal path is selected with masks, not ?:, so that GCC keeps its float operations
  // outside a branch (it may not speculate them under -ftrapping-math; a branch stops the
  // vectoriser).
  const std::uint32_t other = a > 0x7f800000u ? nan : finite;
  return static_cast<std::uint16_t>(sign | (subnormal & is_subnormal) | (other & ~is_subnormal));
}

// IEEE binary16 bits -> float, exact: every binary16 value is a float.
ETUDE_DTYPE_INLINE constexpr float fp16_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t a = h & 0x7fffu;
  const std::uint32_t exponent = a >> 10;
  const std::uint32_t normal = (a << 13) + (112u << 23);   // rebias 15 -> 127
  const std::uint32_t special = (a << 13) + (224u << 23);  // exponent 31 -> 255: inf, NaN (payload kept)
  // Zero and subnormals: a · 2^-24. The product is exact and a normal float (or zero), so neither
  // the rounding mode nor flush-to-zero can change it.
  const std::uint32_t subnormal =
      std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<std::int32_t>(a)) * 0x1p-24f);
  // Selected with a mask, not ?:, so that GCC keeps the product outside a branch (it may not
  // speculate a float operation under -ftrapping-math, and a branch stops the vectoriser).
  const std::uint32_t is_subnormal = 0u - static_cast<std::uint32_t>(exponent == 0u);
  const std::uint32_t other = exponent == 31u ? special : normal;
  return std::bit_cast<float>(sign | (subnormal & is_subnormal) | (other & ~is_subnormal));
}

// double -> float rounded to odd: truncate, then set the lowest bit if anything was dropped. A
// float keeps at least 13 more significant bits than bf16 or fp16 at every exponent the two can
// represent, so rounding this float to nearest even gives the same 16-bit value as rounding the
// double directly (Boldo and Melquiond's round-to-odd); rounding the double to nearest float first
// would not (1 + 2^-8 + 2^-30 would become the tie 1 + 2^-8 and then 1 in bf16, not 1 + 2^-7).
// Works on magnitudes as integers (for non-negative doubles and floats the bit patterns order
// like the values) and with masks, so the only floating-point operations are the two conversions,
// done unconditionally: any rounding mode gives one of the two neighbours, which the correction
// turns into the truncation, but flush-to-zero would lose the float subnormals. Finite values
// beyond the float range are clamped to ±FLT_MAX first (converting them is undefined in C++); it
// is odd, and rounds to infinity in both formats, as the double itself would.
ETUDE_DTYPE_INLINE constexpr float round_to_odd_float(double d) noexcept {
  constexpr std::int64_t max = 0x47efffffe0000000;  // FLT_MAX as a double
  constexpr std::int64_t inf = 0x7ff0000000000000;
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(d);
  const std::uint64_t sign = bits & 0x8000000000000000u;
  const auto magnitude = static_cast<std::int64_t>(bits & 0x7fffffffffffffffu);
  const std::int64_t clamped = magnitude > max && magnitude < inf ? max : magnitude;
  const float nearest = static_cast<float>(std::bit_cast<double>(sign | static_cast<std::uint64_t>(clamped)));
  const auto back =
      static_cast<std::int64_t>(std::bit_cast<std::uint64_t>(static_cast<double>(nearest)) & 0x7fffffffffffffffu);
  const bool number = magnitude <= inf;
  // One less in a float's magnitude bits is one step towards zero.
  const std::uint32_t away = static_cast<std::uint32_t>(number && back > magnitude);
  const std::uint32_t inexact = static_cast<std::uint32_t>(number && back != magnitude);
  return std::bit_cast<float>((std::bit_cast<std::uint32_t>(nearest) - away) | inexact);
}

template <class T>
inline constexpr bool dependent_false = false;

}  // namespace detail

// bfloat16: the upper half of a float (8 exponent bits, 8 significant bits).
struct bf16 {
  std::uint16_t bits;

  bf16() = default;  // trivial: uninitialised, like float
  ETUDE_DTYPE_INLINE constexpr explicit bf16(float f) noexcept : bits(detail::float_to_bf16_bits(f)) {}
  // Rounds the double once (not to float first, then to bf16).
  ETUDE_DTYPE_INLINE constexpr explicit bf16(double d) noexcept
      : bits(detail::float_to_bf16_bits(detail::round_to_odd_float(d))) {}
  ETUDE_DTYPE_INLINE constexpr explicit operator float() const noexcept { return detail::bf16_bits_to_float(bits); }
  static constexpr bf16 from_bits(std::uint16_t b) noexcept {
    bf16 r{};
    r.bits = b;
    return r;
  }
};

// IEEE 754 binary16 (5 exponent bits, 11 significant bits, subnormals down to 2^-24).
struct fp16 {
  std::uint16_t bits;

  fp16() = default;  // trivial: uninitialised, like float
  ETUDE_DTYPE_INLINE constexpr explicit fp16(float f) noexcept : bits(detail::float_to_fp16_bits(f)) {}
  // Rounds the double once (not to float first, then to fp16).
  ETUDE_DTYPE_INLINE constexpr explicit fp16(double d) noexcept
      : bits(detail::float_to_fp16_bits(detail::round_to_odd_float(d))) {}
  ETUDE_DTYPE_INLINE constexpr explicit operator float() const noexcept { return detail::fp16_bits_to_float(bits); }
  static constexpr fp16 from_bits(std::uint16_t b) noexcept {
    fp16 r{};
    r.bits = b;
    return r;
  }
};

static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2, "bf16 must match __nv_bfloat16: 2 bytes, 2-byte aligned");
static_assert(sizeof(fp16) == 2 && alignof(fp16) == 2, "fp16 must match __half: 2 bytes, 2-byte aligned");
static_assert(std::is_trivially_copyable_v<bf16> && std::is_standard_layout_v<bf16> &&
              std::is_trivially_default_constructible_v<bf16>);
static_assert(std::is_trivially_copyable_v<fp16> && std::is_standard_layout_v<fp16> &&
              std::is_trivially_default_constructible_v<fp16>);

template <class T>
inline constexpr bool is_reduced_precision_v = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

// The element types etude stores floating-point tensors in.
template <class T>
concept floating_dtype = std::is_same_v<T, float> || std::is_same_v<T, double> || is_reduced_precision_v<T>;

// Names, sizes and the constants error bounds are derived from. unit_roundoff is 2^-digits, half
// the distance from 1 to the next value: the relative error bound of one rounding to nearest.
template <class T>
struct dtype_traits {
  static_assert(detail::dependent_false<T>,
                "no dtype_traits for this type; supported: float, double, etude::bf16, etude::fp16");
};
template <>
struct dtype_traits<float> {
  using bits_type = std::uint32_t;
  static constexpr std::string_view name = "f32";
  static constexpr std::string_view safetensors_name = "F32";
  static constexpr std::size_t bytes = 4;
  static constexpr int digits = 24;
  static constexpr double unit_roundoff = 0x1p-24;
  static constexpr double max_finite = 0x1.fffffep127;
  static constexpr double min_normal = 0x1p-126;
};
template <>
struct dtype_traits<double> {
  using bits_type = std::uint64_t;
  static constexpr std::string_view name = "f64";
  static constexpr std::string_view safetensors_name = "F64";
  static constexpr std::size_t bytes = 8;
  static constexpr int digits = 53;
  static constexpr double unit_roundoff = 0x1p-53;
  static constexpr double max_finite = 0x1.fffffffffffffp1023;
  static constexpr double min_normal = 0x1p-1022;
};
template <>
struct dtype_traits<bf16> {
  using bits_type = std::uint16_t;
  static constexpr std::string_view name = "bf16";
  static constexpr std::string_view safetensors_name = "BF16";
  static constexpr std::size_t bytes = 2;
  static constexpr int digits = 8;
  static constexpr double unit_roundoff = 0x1p-8;
  static constexpr double max_finite = 0x1.fep127;  // 0x7f7f
  static constexpr double min_normal = 0x1p-126;
};
template <>
struct dtype_traits<fp16> {
  using bits_type = std::uint16_t;
  static constexpr std::string_view name = "f16";
  static constexpr std::string_view safetensors_name = "F16";
  static constexpr std::size_t bytes = 2;
  static constexpr int digits = 11;
  static constexpr double unit_roundoff = 0x1p-11;
  static constexpr double max_finite = 65504.0;  // 0x7bff
  static constexpr double min_normal = 0x1p-14;
};

// Whether two values have the same encoding (+0 and -0 differ; a NaN matches its own bits).
template <floating_dtype T>
constexpr bool same_bits(T a, T b) noexcept {
  using bits = typename dtype_traits<T>::bits_type;
  return std::bit_cast<bits>(a) == std::bit_cast<bits>(b);
}

// One value, rounded to nearest even when To is narrower, exact otherwise:
// `etude::convert<etude::bf16>(x)`, `etude::convert<float>(h)`. double -> float is the compiler's
// conversion (nearest even on IEEE hardware, finite values past the float range become ±inf).
// NaN stays NaN with its sign; narrowing sets the quiet bit and keeps the top payload bits.
template <floating_dtype To, floating_dtype From>
ETUDE_DTYPE_INLINE constexpr To convert(From x) noexcept {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (!is_reduced_precision_v<To>) {
    if constexpr (is_reduced_precision_v<From>)
      return static_cast<To>(static_cast<float>(x));
    else
      return static_cast<To>(x);
  } else if constexpr (std::is_same_v<From, double>) {
    return To(x);  // the single-rounding double constructor
  } else if constexpr (std::is_same_v<From, float>) {
    return To(x);
  } else {
    return To(static_cast<float>(x));  // the other 16-bit format: widening to float is exact
  }
}

namespace detail {
// Below this many elements a conversion runs on the calling thread: starting the team would cost
// more than the loop.
inline constexpr index_t convert_parallel_min = index_t{1} << 16;
}  // namespace detail

// n values from src to dst (which must not overlap), each as `convert<To>(src[i])`; a copy when
// To == From. Parallel over the OpenMP team from 2^16 elements on, vectorised within a thread.
template <floating_dtype To, floating_dtype From>
void convert(To* dst, const From* src, index_t n) noexcept {
  ETUDE_DTYPE_PRAGMA(omp parallel for simd schedule(static) if(parallel : n >= detail::convert_parallel_min))
  for (index_t i = 0; i < n; ++i) dst[i] = convert<To>(src[i]);
}

}  // namespace etude

#undef ETUDE_DTYPE_PRAGMA
#undef ETUDE_DTYPE_INLINE
