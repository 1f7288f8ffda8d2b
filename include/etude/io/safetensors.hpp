// safetensors: Hugging Face's tensor file format, read and written exactly to its description.
//
//   8 bytes   N, the header size, unsigned little-endian
//   N bytes   a UTF-8 JSON object: tensor name -> {"dtype": "F32", "shape": [2, 3],
//             "data_offsets": [begin, end]}, plus an optional "__metadata__" object of
//             string -> string; offsets count from the first byte after the header
//   the rest  the data region: every tensor's bytes, row-major, little-endian, back to back
//
// Reading memory-maps the file (nothing is copied until asked) and refuses everything the reference
// implementation refuses, and a little more: a header over 100 MB, a header that is not a JSON object
// starting with '{', a name given twice, an entry with a missing, unknown or mistyped field, an
// unknown dtype, a byte range that disagrees with shape × dtype size, a gap or an overlap between
// tensors, bytes after the last tensor, and metadata values that are not strings. Every refusal
// names the file and the tensor or field.
//
// Writing lays the tensors out as the reference (safetensors' own serializer) does: by dtype, largest
// element first (U64, I64, F64, C64, F32, U32, I32, BF16, F16, U16, I16, F8_E4M3, F8_E5M2, I8, U8,
// BOOL), then by name (bytewise); so every tensor starts at a multiple of its element size and the
// same tensors give the same bytes as the reference. The header is compact JSON ("__metadata__"
// first, then the tensors in data order), padded with spaces to a multiple of 8 bytes, and always
// carries "format": "pt" in its metadata, as PyTorch-side loaders expect. The file appears under its
// name only once complete and on disk (temporary file, fsync, rename, fsync of the directory).
//
// A file may carry its own digest (write_digested / digest_matches): a metadata value holding the
// XXH64 of every byte of the file as written, with that value's own 16 hex digits read as '0'. It
// covers the size field, the header (names, dtypes, shapes, offsets, every metadata entry, the
// padding) and the data, so no flipped bit anywhere goes unnoticed.
//
// Not for: what a checkpoint holds (optimiser state, step counters), or mapping names to other
// tools (hf_names.hpp). Host-only: needs nlohmann_json and POSIX.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/core/error.hpp"
#include "etude/core/detail/posix_file.hpp"
#include "etude/core/detail/xxhash64.hpp"
#include "etude/io/detail/float16.hpp"
#include "etude/io/detail/strict_json.hpp"

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

// A safetensors file, memory-mapped and validated on construction. Movable; views it hands out
// (tensor bytes, typed spans, names) stay valid while it lives.
class safetensors_file {
 public:
  static constexpr std::uint64_t max_header_bytes = 100'000'000;  // the reference's limit

  explicit safetensors_file(const std::filesystem::path& path) : path_(path) {
    try {
      map_ = etude::detail::mapped_file(path);
    } catch (const safetensors_error&) {
      throw;
    } catch (const file_error& e) {
      throw safetensors_error(e.what());
    }
    parse();
  }

  const std::filesystem::path& path() const noexcept { return path_; }
  // Tensor names in file order (by data offset; empty tensors that share an offset by name).
  const std::vector<std::string>& names() const noexcept { return order_; }
  std::size_t size() const noexcept { return order_.size(); }
  bool contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }
  const std::map<std::string, std::string, std::less<>>& metadata() const noexcept { return metadata_; }
  // N, the header's size in bytes (padding included); the data region starts at 8 + N.
  std::uint64_t header_bytes() const noexcept { return header_bytes_; }
  // Every byte of the file, as mapped.
  std::span<const std::byte> file_bytes() const noexcept {
    return {reinterpret_cast<const std::byte*>(map_.data()), static_cast<std::size_t>(map_.size())};
  }

  // Whether metadata `key` holds the digest of this file that write_digested() stores: false when
  // the key is missing, is not 16 hex digits, appears other than exactly once as written, or the
  // bytes disagree.
  bool digest_matches(std::string_view key) const;

  const tensor_info& info(std::string_view name) const {
    const auto it = tensors_.find(name);
    if (it != tensors_.end()) return it->second;
    std::string some;
    std::size_t shown = 0;
    for (const auto& n : order_) {
      if (shown == 8) {
        some += ", ...";
        break;
      }
      some += (shown++ ? ", " : "") + std::string("\"") + n + "\"";
    }
    throw safetensors_error(where() + ": no tensor named \"" + std::string(name) + "\"; the file holds " +
                            std::to_string(order_.size()) + " tensor(s)" + (some.empty() ? "" : ": " + some));
  }

  // The tensor's elements in place, without a copy. The dtype must be exactly T's; the bytes must be
  // aligned for T (always so in files etude or the reference wrote; otherwise use copy<T>).
  template <tensor_element T>
  std::span<const T> as(std::string_view name) const {
    const tensor_info& t = checked<T>(name);
    if (t.bytes.empty()) return {};
    if (reinterpret_cast<std::uintptr_t>(t.bytes.data()) % alignof(T) != 0)
      throw safetensors_error(where() + ": tensor \"" + std::string(name) + "\" starts at data offset " +
                              std::to_string(t.begin) + ", which is not aligned for " + std::string(dtype_name(t.type)) +
                              " in place; read it with copy<T>() instead");
    return {reinterpret_cast<const T*>(t.bytes.data()), static_cast<std::size_t>(t.numel())};
  }

  // The tensor's elements copied out; works at any alignment. The dtype must be exactly T's.
  template <tensor_element T>
  std::vector<T> copy(std::string_view name) const {
    const tensor_info& t = checked<T>(name);
    std::vector<T> out(static_cast<std::size_t>(t.numel()));
    if (!out.empty()) std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
    return out;
  }

  // A floating-point tensor (F16, BF16, F32 or F64) as floats: 16-bit formats are widened exactly,
  // F64 is rounded to nearest.
  std::vector<float> to_float(std::string_view name) const {
    const tensor_info& t = info(name);
    const auto n = static_cast<std::size_t>(t.numel());
    std::vector<float> out(n);
    const std::byte* p = t.bytes.data();
    switch (t.type) {
      case dtype::f32:
        if (n) std::memcpy(out.data(), p, n * 4);
        break;
      case dtype::f64:
        for (std::size_t i = 0; i < n; ++i) {
          double v;
          std::memcpy(&v, p + 8 * i, 8);
          out[i] = static_cast<float>(v);
        }
        break;
      case dtype::f16:
      case dtype::bf16:
        for (std::size_t i = 0; i < n; ++i) {
          std::uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          out[i] = t.type == dtype::f16 ? detail::f16_to_float(h) : detail::bf16_to_float(h);
        }
        break;
      default:
        throw safetensors_error(where() + ": tensor \"" + std::string(name) + "\" is " + std::string(dtype_name(t.type)) +
                                "; to_float reads only F16, BF16, F32 and F64 tensors");
    }
    return out;
  }

 private:
  std::string where() const { return path_.string(); }

  template <class T>
  const tensor_info& checked(std::string_view name) const {
    const tensor_info& t = info(name);
    if (t.type != dtype_of<T>::value)
      throw safetensors_error(where() + ": tensor \"" + std::string(name) + "\" is " + std::string(dtype_name(t.type)) +
                              ", not the " + std::string(dtype_name(dtype_of<T>::value)) +
                              " that was asked for; read it with the matching element type" +
                              (t.type == dtype::f16 || t.type == dtype::bf16 ? std::string(" or widen it with to_float()")
                                                                             : std::string()));
    return t;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw safetensors_error(where() + ": " + what);
  }

  static bool is_u64(const nlohmann::json& v) { return v.is_number_unsigned(); }
  static std::string type_of(const nlohmann::json& v) {
    if (v.is_number_integer() && !v.is_number_unsigned()) return "a negative integer";
    if (v.is_number_float()) return "a non-integer or out-of-range number";
    return std::string("a JSON ") + v.type_name();
  }

  void parse() {
    const unsigned char* p = map_.data();
    const std::uint64_t file_size = map_.size();
    if (file_size < 8)
      fail("the file is " + std::to_string(file_size) +
           " bytes long, shorter than the 8-byte header size that starts a safetensors file; it is truncated or "
           "not a safetensors file");
    std::uint64_t n = 0;
    std::memcpy(&n, p, 8);
    if (n > max_header_bytes)
      fail("the header size field says " + std::to_string(n) + " bytes, over the limit of " +
           std::to_string(max_header_bytes) + "; the file is corrupt or not a safetensors file");
    if (n > file_size - 8)
      fail("the header size field says " + std::to_string(n) + " bytes, but only " + std::to_string(file_size - 8) +
           " bytes follow it; the file is truncated or corrupt");
    header_bytes_ = n;
    const std::string_view text(reinterpret_cast<const char*>(p + 8), static_cast<std::size_t>(n));
    if (text.empty() || text.front() != '{')
      fail("the header does not start with '{'; a safetensors header is a JSON object");
    // nlohmann's lexer takes a NUL byte for the end of input; JSON text has none, so refuse it here
    // rather than let "{...}\0garbage" through.
    if (const auto nul = text.find('\0'); nul != std::string_view::npos)
      fail("the header holds a NUL byte at header offset " + std::to_string(nul) +
           "; a safetensors header is JSON text, padded with spaces");
    auto parsed = io::detail::parse_strict_json(text);
    if (!parsed.error.empty()) fail("header: " + parsed.error);
    const nlohmann::json& header = parsed.value;
    if (!header.is_object()) fail("the header is not a JSON object");

    const std::byte* data = reinterpret_cast<const std::byte*>(p + 8 + n);
    const std::uint64_t data_size = file_size - 8 - n;

    for (const auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        if (!value.is_object())
          fail("header: \"__metadata__\" must be an object of string values, not " + type_of(value));
        for (const auto& [mk, mv] : value.items()) {
          if (!mv.is_string())
            fail("header: \"__metadata__\" value of \"" + mk + "\" is " + type_of(mv) +
                 "; metadata values must be strings");
          metadata_.emplace(mk, mv.get<std::string>());
        }
        continue;
      }
      tensors_.emplace(key, parse_entry(key, value, data, data_size));
    }

    // The tensors must tile the data region: back to back from offset 0 to its last byte.
    order_.reserve(tensors_.size());
    for (const auto& [name, t] : tensors_) order_.push_back(name);
    std::stable_sort(order_.begin(), order_.end(), [&](const std::string& a, const std::string& b) {
      const auto& ta = tensors_.find(a)->second;
      const auto& tb = tensors_.find(b)->second;
      return std::pair(ta.begin, ta.end) < std::pair(tb.begin, tb.end);
    });
    std::uint64_t cursor = 0;
    const std::string* previous = nullptr;
    for (const auto& name : order_) {
      const auto& t = tensors_.find(name)->second;
      const std::string range = " (data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "])";
      if (t.begin > cursor)
        fail("bytes [" + std::to_string(cursor) + ", " + std::to_string(t.begin) +
             ") of the data region belong to no tensor: a gap before tensor \"" + name + "\"" + range +
             "; tensors must be stored back to back from offset 0");
      if (t.begin < cursor)
        fail("tensor \"" + name + "\"" + range + " overlaps tensor \"" + *previous + "\", which ends at offset " +
             std::to_string(cursor));
      cursor = t.end;
      previous = &name;
    }
    if (cursor != data_size)
      fail(std::to_string(data_size - cursor) + " trailing byte(s) after the last tensor (the tensors end at data offset " +
           std::to_string(cursor) + ", the data region is " + std::to_string(data_size) +
           " bytes); the file is corrupt or was appended to");
  }

  tensor_info parse_entry(const std::string& name, const nlohmann::json& v, const std::byte* data,
                          std::uint64_t data_size) const {
    const std::string who = "tensor \"" + name + "\": ";
    if (!v.is_object())
      fail(who + "its entry must be an object with dtype, shape and data_offsets, not " + type_of(v));
    for (const auto& [field, unused] : v.items()) {
      (void)unused;
      if (field != "dtype" && field != "shape" && field != "data_offsets")
        fail(who + "unknown field \"" + field + "\"; an entry has exactly dtype, shape and data_offsets");
    }
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!v.contains(field)) fail(who + "missing field \"" + field + "\"");

    tensor_info t;
    const auto& dt = v["dtype"];
    if (!dt.is_string()) fail(who + "field \"dtype\" must be a string, not " + type_of(dt));
    const auto type = dtype_from_name(dt.get<std::string>());
    if (!type) {
      static constexpr std::array<std::string_view, 6> other = {"F4",      "F6_E2M3",     "F6_E3M2",
                                                                "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"};
      const auto s = dt.get<std::string>();
      const bool known = std::find(other.begin(), other.end(), s) != other.end();
      fail(who + "dtype \"" + s + "\" is " + (known ? "one etude does not read" : "not a safetensors dtype") +
           "; etude reads " + detail::dtype_list());
    }
    t.type = *type;

    const auto& sh = v["shape"];
    if (!sh.is_array()) fail(who + "field \"shape\" must be an array of non-negative integers, not " + type_of(sh));
    for (std::size_t i = 0; i < sh.size(); ++i) {
      if (!is_u64(sh[i]))
        fail(who + "shape[" + std::to_string(i) + "] is " + type_of(sh[i]) + "; dimensions are non-negative integers");
      t.shape.push_back(sh[i].get<std::uint64_t>());
    }

    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2)
      fail(who + "field \"data_offsets\" must be an array of two non-negative integers [begin, end]");
    for (std::size_t i = 0; i < 2; ++i)
      if (!is_u64(off[i]))
        fail(who + "data_offsets[" + std::to_string(i) + "] is " + type_of(off[i]) + "; offsets are non-negative integers");
    t.begin = off[0].get<std::uint64_t>();
    t.end = off[1].get<std::uint64_t>();
    const std::string range = "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
    if (t.end < t.begin) fail(who + range + " end before they begin");

    const auto numel = element_count(t.shape);
    const auto nbytes = numel ? detail::checked_mul(*numel, dtype_size(t.type)) : std::nullopt;
    if (!nbytes)
      fail(who + "shape " + detail::shape_text(t.shape) + " of " + std::string(dtype_name(t.type)) +
           " overflows 64 bits of bytes");
    if (t.end - t.begin != *nbytes)
      fail(who + range + " span " + std::to_string(t.end - t.begin) + " bytes, but shape " + detail::shape_text(t.shape) +
           " of " + std::string(dtype_name(t.type)) + " (" + std::to_string(dtype_size(t.type)) + " bytes each) needs " +
           std::to_string(*nbytes));
    if (t.end > data_size)
      fail(who + range + " run past the end of the data region (" + std::to_string(data_size) +
           " bytes); the file is truncated or corrupt");
    t.bytes = std::span<const std::byte>(data + t.begin, static_cast<std::size_t>(*nbytes));
    return t;
  }

  std::filesystem::path path_;
  etude::detail::mapped_file map_;
  std::uint64_t header_bytes_ = 0;
  std::map<std::string, tensor_info, std::less<>> tensors_;
  std::vector<std::string> order_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

// Collects tensors and metadata, then writes one safetensors file atomically. Tensor bytes are
// referenced, not copied: they must stay valid until write() returns (a writer of a 1 GB model
// must not need another 1 GB). add() checks each tensor at once, so a mistake names its tensor.
inline bool safetensors_file::digest_matches(std::string_view key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end() || it->second.size() != 16 ||
      it->second.find_first_not_of("0123456789abcdef") != std::string::npos)
    return false;
  const auto bytes = file_bytes();
  const std::string_view header(reinterpret_cast<const char*>(bytes.data()) + 8, static_cast<std::size_t>(header_bytes_));
  const auto at = detail::digest_position(header, key, it->second);
  if (!at) return false;
  const std::size_t digits = 8 + *at;
  etude::detail::xxhash64 h;
  h.update(bytes.data(), digits);
  h.update(std::string_view("0000000000000000"));
  h.update(bytes.data() + digits + 16, bytes.size() - digits - 16);
  char hex[17];
  return etude::detail::hex64(h.digest(), hex) == it->second;
}

class safetensors_writer {
 public:
  safetensors_writer() { metadata_.emplace("format", "pt"); }

  // Raw little-endian bytes of `type`, row-major; bytes.size() must equal numel(shape) · size.
  safetensors_writer& add(std::string name, dtype type, std::vector<std::uint64_t> shape,
                          std::span<const std::byte> bytes) {
    const std::string who = "safetensors_writer: tensor \"" + name + "\": ";
    if (name == "__metadata__") throw invalid_argument(who + "the name is reserved for the header's metadata");
    check_utf8(name, who + "the name is not valid UTF-8");
    for (const auto& e : entries_)
      if (e.name == name) throw invalid_argument(who + "added twice; tensor names must be unique");
    const auto numel = element_count(shape);
    const auto nbytes = numel ? detail::checked_mul(*numel, dtype_size(type)) : std::nullopt;
    if (!nbytes) throw invalid_argument(who + "shape " + detail::shape_text(shape) + " overflows 64 bits of bytes");
    if (*nbytes != bytes.size())
      throw invalid_argument(who + "shape " + detail::shape_text(shape) + " of " + std::string(dtype_name(type)) +
                             " needs " + std::to_string(*nbytes) + " bytes, but " + std::to_string(bytes.size()) +
                             " were given");
    entries_.push_back({std::move(name), type, std::move(shape), bytes});
    return *this;
  }

  // Typed elements; the dtype follows from the element type (float -> F32, std::int64_t -> I64, ...).
  // A temporary container would dangle before write(), so only lvalues and views are accepted.
  template <std::ranges::contiguous_range R>
    requires tensor_element<std::remove_cv_t<std::ranges::range_value_t<R>>> &&
             (std::is_lvalue_reference_v<R> || std::ranges::borrowed_range<R>)
  safetensors_writer& add(std::string name, R&& values, std::vector<std::uint64_t> shape) {
    using T = std::remove_cv_t<std::ranges::range_value_t<R>>;
    const auto* p = reinterpret_cast<const std::byte*>(std::ranges::data(values));
    return add(std::move(name), dtype_of<T>::value, std::move(shape),
               std::span<const std::byte>(p, std::ranges::size(values) * sizeof(T)));
  }

  // A string -> string entry of "__metadata__". "format" is always "pt".
  safetensors_writer& metadata(std::string key, std::string value) {
    const std::string who = "safetensors_writer: metadata \"" + key + "\": ";
    check_utf8(key, who + "the key is not valid UTF-8");
    check_utf8(value, who + "the value is not valid UTF-8");
    if (key == "format" && value != "pt")
      throw invalid_argument(who + "etude always writes \"format\": \"pt\" (PyTorch-side loaders check it), not \"" +
                             value + "\"; record your format under another key");
    metadata_.insert_or_assign(std::move(key), std::move(value));
    return *this;
  }

  std::size_t size() const noexcept { return entries_.size(); }

  // The tensor names in the order their bytes will be written.
  std::vector<std::string> layout_order() const {
    std::vector<std::string> names;
    for (const auto* e : sorted()) names.push_back(e->name);
    return names;
  }

  // The header exactly as write() stores it after the 8-byte size: compact JSON padded with spaces.
  std::string header() const {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    h["__metadata__"] = std::move(meta);
    std::uint64_t offset = 0;
    for (const auto* e : sorted()) {
      nlohmann::ordered_json t = nlohmann::ordered_json::object();
      t["dtype"] = std::string(dtype_name(e->type));
      t["shape"] = e->shape;
      t["data_offsets"] = nlohmann::ordered_json::array({offset, offset + e->bytes.size()});
      offset += e->bytes.size();
      h[e->name] = std::move(t);
    }
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    return text;
  }

  void write(const std::filesystem::path& path) const { write_file(path, header()); }

  // The data region write() stores after the header: every tensor's bytes in layout_order().
  std::string data_region() const {
    std::string out;
    for (const auto* e : sorted()) out.append(reinterpret_cast<const char*>(e->bytes.data()), e->bytes.size());
    return out;
  }

  // write(), with metadata `key` set to the digest of the whole file (see the top of this header).
  void write_digested(const std::filesystem::path& path, const std::string& key) {
    write_file(path, digested_header(key));
  }

  // The header write_digested() stores: laid out with 16 '0' digits as the value of `key`, every
  // byte of the file-to-be hashed, and the digits filled in. The file is the 8-byte size, this
  // header, then the tensors' bytes in layout_order().
  std::string digested_header(const std::string& key) {
    metadata(key, std::string(16, '0'));
    std::string text = header();
    const auto at = detail::digest_position(text, key, std::string(16, '0'));
    if (!at) throw invalid_argument("safetensors_writer: metadata \"" + key + "\" cannot hold a digest");
    etude::detail::xxhash64 h;
    const std::uint64_t n = text.size();
    h.update(&n, 8);
    h.update(text);
    for (const auto* e : sorted())
      if (!e->bytes.empty()) h.update(e->bytes.data(), e->bytes.size());
    char hex[17];
    const auto digits = etude::detail::hex64(h.digest(), hex);
    text.replace(*at, 16, digits);
    metadata_.insert_or_assign(key, std::string(digits));
    return text;
  }

 private:
  void write_file(const std::filesystem::path& path, const std::string& text) const {
    if (text.size() > safetensors_file::max_header_bytes)
      throw invalid_argument(path.string() + ": the safetensors header would be " + std::to_string(text.size()) +
                             " bytes, over the " + std::to_string(safetensors_file::max_header_bytes) +
                             "-byte limit readers enforce; split the tensors over several files");
    try {
      etude::detail::atomic_file out(path);
      const std::uint64_t n = text.size();
      out.write(&n, 8);
      out.write(text.data(), text.size());
      for (const auto* e : sorted())
        if (!e->bytes.empty()) out.write(e->bytes.data(), e->bytes.size());
      out.commit();
    } catch (const safetensors_error&) {
      throw;
    } catch (const file_error& e) {
      throw safetensors_error(e.what());
    }
  }

  struct entry {
    std::string name;
    dtype type;
    std::vector<std::uint64_t> shape;
    std::span<const std::byte> bytes;
  };

  static void check_utf8(const std::string& s, const std::string& message) {
    try {
      (void)nlohmann::json(s).dump();
    } catch (const nlohmann::json::exception&) {
      throw invalid_argument(message);
    }
  }

  std::vector<const entry*> sorted() const {
    std::vector<const entry*> v;
    for (const auto& e : entries_) v.push_back(&e);
    std::sort(v.begin(), v.end(), [](const entry* a, const entry* b) {
      if (a->type != b->type) return a->type > b->type;
      return a->name < b->name;
    });
    return v;
  }

  std::vector<entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace etude::io
