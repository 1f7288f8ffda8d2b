// CRC-32C (Castagnoli; reflected polynomial 0x82F63B78, initial value and final xor ~0), the
// checksum TFRecord framing uses, and TFRecord's masked form of it. Slicing-by-8 tables built at
// compile time; where the compiler targets SSE4.2 (__SSE4_2__) the x86 `crc32` instruction does
// the work instead, with the same result. Usable in constant expressions through the
// std::string_view overload.
// Not for: integrity of large data files (the token shards use XXH64, core/detail/xxhash64.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#if defined(__SSE4_2__) && (defined(__x86_64__) || defined(_M_X64))
#include <nmmintrin.h>
#define ETUDE_CRC32C_SSE42 1
#else
#define ETUDE_CRC32C_SSE42 0
#endif

namespace etude::detail {

namespace crc32c_impl {

inline constexpr std::uint32_t crc32c_poly = 0x82F63B78u;

// table[0] is the classic byte-at-a-time table; table[k][b] is the CRC of byte b followed by k
// zero bytes, which lets eight input bytes be folded in with eight independent lookups.
inline constexpr auto crc32c_tables = [] {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c & 1u) ? (c >> 1) ^ crc32c_poly : c >> 1;
    t[0][b] = c;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
  return t;
}();

template <class Byte>
concept byte_like = sizeof(Byte) == 1 && (std::is_same_v<Byte, char> || std::is_same_v<Byte, unsigned char> ||
                                          std::is_same_v<Byte, signed char> || std::is_same_v<Byte, std::byte>);

template <byte_like Byte>
constexpr std::uint32_t u8_at(const Byte* p, std::size_t i) noexcept {
  return static_cast<std::uint32_t>(static_cast<unsigned char>(p[i]));
}

// Little-endian words assembled from bytes: independent of the host's byte order and valid in
// constant expressions; compilers turn it into a single load.
template <byte_like Byte>
constexpr std::uint32_t le32_at(const Byte* p, std::size_t i) noexcept {
  return u8_at(p, i) | (u8_at(p, i + 1) << 8) | (u8_at(p, i + 2) << 16) | (u8_at(p, i + 3) << 24);
}

// Updates the raw (already inverted) register `c` with n bytes; slicing-by-8.
template <byte_like Byte>
constexpr std::uint32_t crc32c_update_table(std::uint32_t c, const Byte* p, std::size_t n) noexcept {
  const auto& t = crc32c_tables;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::uint32_t lo = c ^ le32_at(p, i);
    const std::uint32_t hi = le32_at(p, i + 4);
    c = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24] ^
        t[3][hi & 0xffu] ^ t[2][(hi >> 8) & 0xffu] ^ t[1][(hi >> 16) & 0xffu] ^ t[0][hi >> 24];
  }
  for (; i < n; ++i) c = (c >> 8) ^ t[0][(c ^ u8_at(p, i)) & 0xffu];
  return c;
}

#if ETUDE_CRC32C_SSE42
inline std::uint32_t crc32c_update_sse42(std::uint32_t c, const unsigned char* p, std::size_t n) noexcept {
  std::uint64_t c64 = c;
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);  // unaligned, and the instruction wants little-endian order, which x86 is
    c64 = _mm_crc32_u64(c64, w);
  }
  c = static_cast<std::uint32_t>(c64);
  for (; n > 0; ++p, --n) c = _mm_crc32_u8(c, *p);
  return c;
}
#endif

}  // namespace crc32c_impl

// True when crc32c() uses the SSE4.2 instruction (the compiler targets SSE4.2 on x86-64).
inline constexpr bool crc32c_uses_sse42 = ETUDE_CRC32C_SSE42 != 0;

// The CRC-32C of `crc`'s bytes followed by these n bytes: crc32c_extend(crc32c(a), b) ==
// crc32c(a + b), and crc32c_extend(0, ...) is the CRC of the bytes alone. Always the table path.
inline std::uint32_t crc32c_extend_table(std::uint32_t crc, const void* data, std::size_t n) noexcept {
  return ~crc32c_impl::crc32c_update_table(~crc, static_cast<const unsigned char*>(data), n);
}

// As crc32c_extend_table, through the SSE4.2 instruction when available.
inline std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t n) noexcept {
#if ETUDE_CRC32C_SSE42
  return ~crc32c_impl::crc32c_update_sse42(~crc, static_cast<const unsigned char*>(data), n);
#else
  return crc32c_extend_table(crc, data, n);
#endif
}

inline std::uint32_t crc32c(const void* data, std::size_t n) noexcept { return crc32c_extend(0, data, n); }

constexpr std::uint32_t crc32c(std::string_view bytes) noexcept {
  if (std::is_constant_evaluated()) return ~crc32c_impl::crc32c_update_table(~0u, bytes.data(), bytes.size());
  return crc32c_extend(0, bytes.data(), bytes.size());
}

// TFRecord stores CRCs masked, because a CRC of data that itself contains CRCs is weak: rotate
// right by 15 bits and add a constant (mod 2^32).
constexpr std::uint32_t masked_crc32c(std::uint32_t crc) noexcept {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
constexpr std::uint32_t unmask_crc32c(std::uint32_t masked) noexcept {
  const std::uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace etude::detail

#undef ETUDE_CRC32C_SSE42
