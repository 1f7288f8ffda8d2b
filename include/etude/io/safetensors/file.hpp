// Reading a safetensors file: safetensors_file memory-maps it, refuses everything the reference
// refuses (and the few more things io/safetensors.hpp's top comment lists), naming the file and the
// tensor or field, then hands out tensors in place, copied, or widened to float, and checks a
// self-digest written by safetensors_writer::write_digested.
// Not for: writing (safetensors/writer.hpp), what the tensors mean (io/checkpoint.hpp, hf_names.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/core/detail/posix_file.hpp"
#include "etude/core/detail/xxhash64.hpp"
#include "etude/core/error.hpp"
#include "etude/io/detail/float16.hpp"
#include "etude/io/detail/strict_json.hpp"
#include "etude/io/safetensors/format.hpp"

namespace etude::io {

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

}  // namespace etude::io
