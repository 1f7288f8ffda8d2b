// Reads arrays saved by NumPy (np.save), `.npy` format version 1, 2 or 3, C order, little-endian:
// - codec codes, as AudioCraft / EnCodec pipelines write them (read_npy_codes): an integer array
//   shaped [K, T] (or [1, K, T], a single-item batch); int16/int32/int64 and their unsigned and
//   8-bit kin are accepted; Fortran order, big-endian, floats and anything else are refused by name;
// - any array mapped in place (map_npy): header checked and the data's extent bounded by the file,
//   for the condition embeddings (float32/float16) and their masks (uint8/bool) that
//   embedding_store.hpp reads row by row without copying the file.
// Not for: writing .npy, or validating ids against a codebook (the packer).
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "etude/core/types.hpp"
#include "etude/core/detail/posix_file.hpp"
#include "etude/data/error.hpp"

namespace etude::data {

struct npy_header {
  int major = 0;
  int minor = 0;
  std::string descr;  // e.g. "<i2"
  bool fortran_order = false;
  std::vector<std::uint64_t> shape;
  std::uint64_t data_offset = 0;  // first byte of the array
};

struct npy_codes {
  std::string dtype;                 // the file's descr, e.g. "<i8"
  int codebooks = 0;                 // K
  index_t frames = 0;                // T
  std::vector<std::int64_t> values;  // (K, T), widened to int64 so out-of-range ids stay visible
};

namespace detail {

// The header is a Python dict literal: {'descr': '<i2', 'fortran_order': False, 'shape': (4, 1500), }
class npy_dict_parser {
 public:
  npy_dict_parser(std::string_view text, const std::string& where) : s_(text), where_(where) {}

  npy_header parse() {
    npy_header h;
    bool has_descr = false, has_order = false, has_shape = false;
    expect('{');
    while (!peek('}')) {
      const std::string key = quoted();
      expect(':');
      if (key == "descr") {
        h.descr = quoted();
        has_descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = boolean();
        has_order = true;
      } else if (key == "shape") {
        h.shape = tuple();
        has_shape = true;
      } else {
        throw fail("unexpected key '" + key + "'");
      }
      if (!peek('}')) expect(',');
    }
    expect('}');
    if (!has_descr || !has_order || !has_shape) throw fail("the header lacks descr, fortran_order or shape");
    return h;
  }

 private:
  data_error fail(const std::string& what) const {
    return data_error(where_ + ": malformed .npy header (" + what + " near byte " + std::to_string(at_) +
                      "); is this a file written by numpy.save?");
  }
  void skip_space() {
    while (at_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[at_]))) ++at_;
  }
  bool peek(char c) {
    skip_space();
    return at_ < s_.size() && s_[at_] == c;
  }
  void expect(char c) {
    if (!peek(c)) throw fail(std::string("expected '") + c + "'");
    ++at_;
  }
  std::string quoted() {
    skip_space();
    if (at_ >= s_.size() || (s_[at_] != '\'' && s_[at_] != '"')) throw fail("expected a quoted string");
    const char q = s_[at_++];
    const auto end = s_.find(q, at_);
    if (end == std::string_view::npos) throw fail("unterminated string");
    std::string out(s_.substr(at_, end - at_));
    at_ = end + 1;
    return out;
  }
  bool boolean() {
    skip_space();
    if (s_.substr(at_, 4) == "True") {
      at_ += 4;
      return true;
    }
    if (s_.substr(at_, 5) == "False") {
      at_ += 5;
      return false;
    }
    throw fail("expected True or False");
  }
  std::vector<std::uint64_t> tuple() {
    std::vector<std::uint64_t> dims;
    expect('(');
    while (!peek(')')) {
      skip_space();
      std::uint64_t v = 0;
      const std::size_t start = at_;
      while (at_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[at_]))) {
        if (v > (~std::uint64_t{0} - 9) / 10) throw fail("dimension too large");
        v = v * 10 + static_cast<std::uint64_t>(s_[at_++] - '0');
      }
      if (at_ == start) throw fail("expected a dimension");
      if (at_ < s_.size() && s_[at_] == 'L') ++at_;  // Python 2 longs
      dims.push_back(v);
      if (!peek(')')) expect(',');
    }
    expect(')');
    return dims;
  }

  std::string_view s_;
  const std::string& where_;
  std::size_t at_ = 0;
};

}  // namespace detail

// Parses the preamble and header of a .npy image of `size` bytes.
inline npy_header parse_npy_header(const unsigned char* p, std::uint64_t size, const std::string& where) {
  static constexpr unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (size < 10 || std::memcmp(p, magic, 6) != 0)
    throw data_error(where + ": not a .npy file (missing the \\x93NUMPY magic" +
                     std::string(size < 10 ? ", or truncated" : "") + "); save codes with numpy.save");
  npy_header h;
  h.major = p[6];
  h.minor = p[7];
  std::uint64_t len = 0, start = 0;
  if (h.major == 1) {
    len = static_cast<std::uint64_t>(p[8]) | (static_cast<std::uint64_t>(p[9]) << 8);
    start = 10;
  } else if (h.major == 2 || h.major == 3) {
    if (size < 12) throw data_error(where + ": truncated .npy preamble");
    len = static_cast<std::uint64_t>(p[8]) | (static_cast<std::uint64_t>(p[9]) << 8) |
          (static_cast<std::uint64_t>(p[10]) << 16) | (static_cast<std::uint64_t>(p[11]) << 24);
    start = 12;
  } else {
    throw data_error(where + ": .npy format version " + std::to_string(h.major) + "." + std::to_string(h.minor) +
                     " is not supported (1.0, 2.0 and 3.0 are)");
  }
  if (len > size - start)
    throw data_error(where + ": truncated .npy header (" + std::to_string(len) + " header bytes announced, " +
                     std::to_string(size - start) + " present)");
  const npy_header parsed =
      detail::npy_dict_parser(std::string_view(reinterpret_cast<const char*>(p + start), len), where).parse();
  h.descr = parsed.descr;
  h.fortran_order = parsed.fortran_order;
  h.shape = parsed.shape;
  h.data_offset = start + len;
  return h;
}

// Element size in bytes and signedness of an accepted integer dtype, or 0 when refused.
inline int npy_integer_size(std::string_view descr, bool& is_signed) {
  if (descr.size() != 3) return 0;
  const char order = descr[0], kind = descr[1], width = descr[2];
  if (kind != 'i' && kind != 'u') return 0;
  is_signed = kind == 'i';
  const int bytes = width == '1' ? 1 : width == '2' ? 2 : width == '4' ? 4 : width == '8' ? 8 : 0;
  if (bytes == 0) return 0;
  // '|' (no order) is what numpy writes for single bytes; '=' is native, little-endian here.
  if (order == '<' || order == '=' || (order == '|' && bytes == 1)) return bytes;
  return 0;
}

// A .npy file mapped into memory, its header parsed: shape, element type (kind 'f', 'i', 'u' or
// 'b' and bytes per element) and where the C-order data starts. The constructor refuses Fortran
// order, big-endian data, a dtype outside float16/32/64, integers and bool, and a file shorter than
// its header promises, naming the file.
class npy_mapped {
 public:
  explicit npy_mapped(const std::filesystem::path& path) : file_(path) {
    const std::string where = path.string();
    header_ = parse_npy_header(file_.data(), file_.size(), where);
    const std::string& d = header_.descr;
    const bool known = d.size() == 3 && (d[1] == 'f' || d[1] == 'i' || d[1] == 'u' || d[1] == 'b') &&
                       (d[2] == '1' || d[2] == '2' || d[2] == '4' || d[2] == '8');
    bytes_ = known ? d[2] - '0' : 0;
    // '|' (no order) is what numpy writes for single bytes; '=' is native, little-endian here.
    if (!known || (d[1] == 'f' && bytes_ == 1) || (d[1] == 'b' && bytes_ != 1) ||
        !(d[0] == '<' || d[0] == '=' || (d[0] == '|' && bytes_ == 1)))
      throw data_error(where + ": dtype '" + d +
                       "' is not supported; save little-endian floats (<f4, <f2), integers or bool");
    kind_ = d[1];
    if (header_.fortran_order)
      throw data_error(where + ": the array is in Fortran order; save a C-order array "
                       "(numpy.save(path, numpy.ascontiguousarray(a)))");
    std::uint64_t n = 1;
    const std::uint64_t available = file_.size() - header_.data_offset;
    for (const auto dim : header_.shape) {
      // Overflow-safe: every partial product is bounded by the file's size before the next multiply.
      if (dim != 0 && n > available / dim) {
        n = ~std::uint64_t{0};
        break;
      }
      n *= dim;
    }
    if (n == ~std::uint64_t{0} || n > available / static_cast<std::uint64_t>(bytes_))
      throw data_error(where + ": truncated: the header announces shape " + shape_text() + " of " +
                       std::to_string(bytes_) + "-byte elements but only " + std::to_string(available) +
                       " data bytes follow; re-save the file");
    elements_ = n;
  }

  const std::filesystem::path& path() const noexcept { return file_.path(); }
  const npy_header& header() const noexcept { return header_; }
  const std::vector<std::uint64_t>& shape() const noexcept { return header_.shape; }
  char kind() const noexcept { return kind_; }           // 'f', 'i', 'u' or 'b'
  int element_bytes() const noexcept { return bytes_; }  // 1, 2, 4 or 8
  std::uint64_t elements() const noexcept { return elements_; }
  const unsigned char* data() const noexcept { return file_.data() + header_.data_offset; }
  // "(3, 64, 384)", for messages.
  std::string shape_text() const {
    std::string s = "(";
    for (std::size_t i = 0; i < header_.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(header_.shape[i]);
    return s + ")";
  }

 private:
  etude::detail::mapped_file file_;
  npy_header header_;
  char kind_ = 0;
  int bytes_ = 0;
  std::uint64_t elements_ = 0;
};

inline npy_codes read_npy_codes(const std::filesystem::path& path) {
  const std::string where = path.string();
  etude::detail::mapped_file file(path);
  const npy_header h = parse_npy_header(file.data(), file.size(), where);
  bool is_signed = true;
  const int bytes = npy_integer_size(h.descr, is_signed);
  if (bytes == 0)
    throw data_error(where + ": dtype '" + h.descr +
                     "' is not supported; codes must be little-endian integers (<i2, <i4, <i8, <u2, <u4, ...): "
                     "convert with codes.astype('<i4') before numpy.save");
  if (h.fortran_order)
    throw data_error(where + ": the array is in Fortran order; save a C-order array "
                     "(numpy.save(path, numpy.ascontiguousarray(codes)))");
  std::vector<std::uint64_t> shape = h.shape;
  if (shape.size() == 3 && shape[0] == 1) shape.erase(shape.begin());
  if (shape.size() != 2) {
    std::string dims;
    for (auto d : h.shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    throw data_error(where + ": shape (" + dims + ") is not [K, T] or [1, K, T]; save one example's codes, "
                     "codebooks first");
  }
  if (shape[0] == 0 || shape[0] > 65535)
    throw data_error(where + ": shape has " + std::to_string(shape[0]) + " codebooks; expected [K, T] with 1 <= K <= 65535");
  // Overflow-safe: T is bounded by the file size before anything multiplies it.
  const std::uint64_t available = file.size() - h.data_offset;
  if (shape[1] > available / shape[0] / static_cast<std::uint64_t>(bytes))
    throw data_error(where + ": truncated: the header announces " + std::to_string(shape[0]) + " x " +
                     std::to_string(shape[1]) + " elements of " + std::to_string(bytes) + " bytes but only " +
                     std::to_string(available) + " data bytes follow");
  npy_codes out;
  out.dtype = h.descr;
  out.codebooks = static_cast<int>(shape[0]);
  out.frames = static_cast<index_t>(shape[1]);
  const std::size_t n = static_cast<std::size_t>(shape[0] * shape[1]);
  out.values.resize(n);
  const unsigned char* d = file.data() + h.data_offset;
  auto widen = [&]<class T>(T) {
    for (std::size_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, d + i * sizeof(T), sizeof(T));
      out.values[i] = static_cast<std::int64_t>(v);
    }
  };
  switch (bytes * (is_signed ? 1 : -1)) {
    case 1: widen(std::int8_t{}); break;
    case 2: widen(std::int16_t{}); break;
    case 4: widen(std::int32_t{}); break;
    case 8: widen(std::int64_t{}); break;
    case -1: widen(std::uint8_t{}); break;
    case -2: widen(std::uint16_t{}); break;
    case -4: widen(std::uint32_t{}); break;
    default: {  // uint64: values beyond int64 are outside any codebook; saturate so they stay too large
      for (std::size_t i = 0; i < n; ++i) {
        std::uint64_t v;
        std::memcpy(&v, d + i * 8, 8);
        out.values[i] = static_cast<std::int64_t>(std::min<std::uint64_t>(v, 0x7fffffffffffffffULL));
      }
    }
  }
  return out;
}

}  // namespace etude::data
