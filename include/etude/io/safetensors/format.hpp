// The vocabulary of a safetensors file (layout: io/safetensors.hpp's top comment): its element
// types (dtype, with names and sizes in the reference's order, and dtype_of for C++ element types),
// element counts with overflow checks, one tensor's entry (tensor_info), and safetensors_error, the
// file_error every refusal raises.
// Not for: reading a file (safetensors/file.hpp) or writing one (safetensors/writer.hpp).
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "etude/core/error.hpp"

namespace etude::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; etude reads and writes them in place, so it needs a "
              "little-endian host");

// A safetensors file that is missing, unreadable, malformed or inconsistent, or a tensor asked of it
// that it does not hold in the form asked. A file_error, so one handler catches every file problem.
class safetensors_error : public file_error {
 public:
  using file_error::file_error;
};

// The element types etude reads and writes, in the reference's order (which is by element size).
// The sub-byte and exotic float formats newer files may carry (F4, F6_*, F8_E8M0, ...) are refused
// by name.
enum class dtype : unsigned char { boolean, u8, i8, f8_e5m2, f8_e4m3, i16, u16, f16, bf16, i32, u32, f32, c64, f64, i64, u64 };

namespace detail {
struct dtype_entry {
  dtype type;
  std::string_view name;
  std::uint64_t size;  // bytes per element
};
inline constexpr std::array<dtype_entry, 16> dtype_table{{
    {dtype::boolean, "BOOL", 1}, {dtype::u8, "U8", 1},     {dtype::i8, "I8", 1},   {dtype::f8_e5m2, "F8_E5M2", 1},
    {dtype::f8_e4m3, "F8_E4M3", 1}, {dtype::i16, "I16", 2}, {dtype::u16, "U16", 2}, {dtype::f16, "F16", 2},
    {dtype::bf16, "BF16", 2},    {dtype::i32, "I32", 4},   {dtype::u32, "U32", 4}, {dtype::f32, "F32", 4},
    {dtype::c64, "C64", 8},      {dtype::f64, "F64", 8},   {dtype::i64, "I64", 8}, {dtype::u64, "U64", 8},
}};

inline std::string dtype_list() {
  std::string s;
  for (const auto& e : dtype_table) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

// a · b, or nullopt when it does not fit in 64 bits.
constexpr std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > UINT64_MAX / a) return std::nullopt;
  return a * b;
}

// Where the 16 digits of metadata `key` with value `digits` start in header text, if that entry
// appears exactly once as etude writes it ("key":"digits"). Inside a JSON string a quote is
// escaped, so the pattern cannot hide in another value.
inline std::optional<std::size_t> digest_position(std::string_view header, std::string_view key,
                                                  std::string_view digits) {
  if (digits.size() != 16 || key.find_first_of("\"\\") != std::string_view::npos) return std::nullopt;
  std::string needle = "\"";
  needle.append(key);
  needle += "\":\"";
  needle.append(digits);
  needle += '"';
  const std::size_t first = header.find(needle);
  if (first == std::string_view::npos || header.find(needle, first + 1) != std::string_view::npos) return std::nullopt;
  return first + needle.size() - 17;
}

inline std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}
}  // namespace detail

constexpr std::string_view dtype_name(dtype t) { return detail::dtype_table[static_cast<std::size_t>(t)].name; }
constexpr std::uint64_t dtype_size(dtype t) { return detail::dtype_table[static_cast<std::size_t>(t)].size; }
constexpr std::optional<dtype> dtype_from_name(std::string_view name) {
  for (const auto& e : detail::dtype_table)
    if (e.name == name) return e.type;
  return std::nullopt;
}

// The dtype a C++ element type is stored as; defined only for the unambiguous ones. F16, BF16, the
// F8 formats, C64 and BOOL have no C++ counterpart here: read them as bytes, or widen with to_float.
template <class T>
struct dtype_of;
template <> struct dtype_of<float> : std::integral_constant<dtype, dtype::f32> {};
template <> struct dtype_of<double> : std::integral_constant<dtype, dtype::f64> {};
template <> struct dtype_of<std::int8_t> : std::integral_constant<dtype, dtype::i8> {};
template <> struct dtype_of<std::uint8_t> : std::integral_constant<dtype, dtype::u8> {};
template <> struct dtype_of<std::int16_t> : std::integral_constant<dtype, dtype::i16> {};
template <> struct dtype_of<std::uint16_t> : std::integral_constant<dtype, dtype::u16> {};
template <> struct dtype_of<std::int32_t> : std::integral_constant<dtype, dtype::i32> {};
template <> struct dtype_of<std::uint32_t> : std::integral_constant<dtype, dtype::u32> {};
template <> struct dtype_of<std::int64_t> : std::integral_constant<dtype, dtype::i64> {};
template <> struct dtype_of<std::uint64_t> : std::integral_constant<dtype, dtype::u64> {};

template <class T>
concept tensor_element = requires { dtype_of<T>::value; };

// Elements in a shape; 1 for a scalar (shape []), 0 when any dimension is 0. nullopt on overflow.
inline std::optional<std::uint64_t> element_count(const std::vector<std::uint64_t>& shape) {
  std::uint64_t n = 1;
  for (const auto d : shape) {
    const auto m = detail::checked_mul(n, d);
    if (!m) return std::nullopt;
    n = *m;
  }
  return n;
}

// One tensor of an open file. `bytes` points into the file's mapping and lives as long as the file.
struct tensor_info {
  dtype type = dtype::f32;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;  // data_offsets, relative to the data region
  std::uint64_t end = 0;
  std::span<const std::byte> bytes;

  std::uint64_t numel() const { return bytes.size() / dtype_size(type); }
};

}  // namespace etude::io
