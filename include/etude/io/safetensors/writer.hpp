// Writing a safetensors file: safetensors_writer lays the tensors out as the reference does (by
// dtype, largest element first, then by name), pads the compact header to 8 bytes, writes the file
// atomically, and can store the whole file's XXH64 in one metadata entry (write_digested).
// Not for: reading (safetensors/file.hpp), checkpoint layouts (io/checkpoint/).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "etude/core/detail/posix_file.hpp"
#include "etude/core/detail/xxhash64.hpp"
#include "etude/core/error.hpp"
#include "etude/io/safetensors/file.hpp"
#include "etude/io/safetensors/format.hpp"

namespace etude::io {

// Collects tensors and metadata, then writes one safetensors file atomically. Tensor bytes are
// referenced, not copied: they must stay valid until write() returns (a writer of a 1 GB model
// must not need another 1 GB). add() checks each tensor at once, so a mistake names its tensor.
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

  // write(), with metadata `key` set to the digest of the whole file (io/safetensors.hpp, top comment).
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
