// Widening of the two 16-bit float formats safetensors files carry (IEEE binary16 "F16" and
// bfloat16 "BF16") to float, exactly: every 16-bit value is representable as a float, so the
// conversion never rounds. NaN payloads are kept (no quieting), infinities and signed zeros too.
// Not for: narrowing float to 16 bits (etude trains and saves fp32 master weights).
#pragma once

#include <bit>
#include <cstdint>

namespace etude::io::detail {

inline float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa · 2^-24, which a float holds exactly.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  // Rebias 15 -> 127.
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// bfloat16 is the upper half of a float.
inline float bf16_to_float(std::uint16_t b) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

}  // namespace etude::io::detail
