// Writes one token shard: examples are appended one at a time (tokens [K, T_i], id, conditions),
// streamed to a hidden temporary beside the target and hashed on the way; finalize() writes the
// index and header, fsyncs and renames, so the shard appears complete or not at all.
// Not for: choosing splits or shard boundaries (pack.hpp), reading (shard_reader.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "etude/core/types.hpp"
#include "etude/data/codec.hpp"
#include "etude/data/conditions.hpp"
#include "etude/core/detail/posix_file.hpp"
#include "etude/core/detail/xxhash64.hpp"
#include "etude/data/error.hpp"
#include "etude/data/shard_format.hpp"

namespace etude::data {

// What a finished shard is, as its manifest entry records it.
struct shard_summary {
  std::filesystem::path path;
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;
  std::uint64_t examples = 0;
  std::uint64_t frames = 0;  // sum of T_i; codec tokens = K * frames
};

class shard_writer {
 public:
  shard_writer(std::filesystem::path path, codec_spec codec) : file_(path), codec_(std::move(codec)) {
    const std::string where = path.string();
    if (codec_.codebooks <= 0 || codec_.codebooks > 65535)
      throw invalid_argument(where + ": codebooks (K) = " + std::to_string(codec_.codebooks) + " must be in [1, 65535]");
    if (codec_.card <= 0) throw invalid_argument(where + ": card = " + std::to_string(codec_.card) + " must be positive");
    if (!(codec_.frame_rate > 0) || !(codec_.frame_rate < 1e9))
      throw invalid_argument(where + ": frame_rate must be a positive number of frames per second");
    if (codec_.name.size() > shard_format::max_string_bytes || codec_.version.size() > shard_format::max_string_bytes)
      throw invalid_argument(where + ": codec name and version must be shorter than 64 KiB");
    token_bytes_ = shard_format::token_bytes_for_card(codec_.card);
    header_bytes_ = shard_format::header_bytes_for(codec_.name.size(), codec_.version.size());
    // Reserve the header; it is written last, once the index position and checksum are known.
    buffer_.assign(static_cast<std::size_t>(header_bytes_), 0);
    offset_ = header_bytes_;
    hashed_from_ = header_bytes_;
  }

  shard_writer(const shard_writer&) = delete;
  shard_writer& operator=(const shard_writer&) = delete;

  // Appends one example. `tokens` is (K, frames), codebook-major, every id in [0, card); `id`
  // is non-empty and unique within the shard. Nothing is written when a check fails.
  template <class Int>
  void add(std::string_view id, std::span<const Int> tokens, index_t frames, const conditions& cond = {}) {
    static_assert(std::is_integral_v<Int>, "shard_writer::add takes integer token ids");
    const std::string where = file_.target().string() + ": example " + std::to_string(entries_.size()) + " (id \"" +
                              std::string(id) + "\")";
    if (finalized_) throw invalid_argument(where + ": the shard is already finalized");
    if (id.empty() || id.size() > shard_format::max_string_bytes)
      throw data_error(where + ": field id must be non-empty and shorter than 64 KiB");
    if (frames <= 0 || static_cast<index_t>(tokens.size()) != codec_.codebooks * frames)
      throw data_error(where + ": tokens hold " + std::to_string(tokens.size()) + " ids but K x T = " +
                       std::to_string(codec_.codebooks) + " x " + std::to_string(frames) +
                       "; pass a non-empty (K, T) array in codebook-major order");
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto v = tokens[i];
      if (v < 0 || static_cast<std::uint64_t>(v) >= static_cast<std::uint64_t>(codec_.card))
        throw data_error(where + ": token " + std::to_string(v) + " at codebook " +
                         std::to_string(static_cast<index_t>(i) / frames) + ", frame " +
                         std::to_string(static_cast<index_t>(i) % frames) + " is outside [0, " +
                         std::to_string(codec_.card) + "); the tokens come from another codec, or card is wrong");
    }
    check_conditions(cond, where);
    if (!ids_.insert(std::string(id)).second)
      throw data_error(where + ": field id is a duplicate within the shard; give every example a unique id");

    shard_format::index_entry e;
    pad_to(shard_format::align_up(offset_, shard_format::token_alignment));
    e.tokens_offset = offset_;
    e.frames = static_cast<std::uint64_t>(frames);
    if (token_bytes_ == 2) append_tokens<std::uint16_t>(tokens);
    else append_tokens<std::uint32_t>(tokens);
    const auto meta = shard_format::encode_meta(id, cond);
    e.meta_offset = offset_;
    e.meta_bytes = meta.size();
    append(meta.data(), meta.size());
    entries_.push_back(e);
    total_frames_ += e.frames;
  }
  template <class Int>
  void add(std::string_view id, const std::vector<Int>& tokens, index_t frames, const conditions& cond = {}) {
    add(id, std::span<const Int>(tokens), frames, cond);
  }

  // Writes index and header and renames the shard into place. Call once; a writer destroyed
  // without finalize() leaves no file behind.
  shard_summary finalize() {
    if (finalized_) throw invalid_argument(file_.target().string() + ": finalize() called twice");
    pad_to(shard_format::align_up(offset_, 8));
    shard_format::header h;
    h.header_bytes = static_cast<std::uint32_t>(header_bytes_);
    h.codebooks = static_cast<std::uint32_t>(codec_.codebooks);
    h.card = static_cast<std::uint32_t>(codec_.card);
    h.token_bytes = token_bytes_;
    h.frame_rate = codec_.frame_rate;
    h.example_count = entries_.size();
    h.total_frames = total_frames_;
    h.payload_offset = header_bytes_;
    h.index_offset = offset_;
    h.file_bytes = offset_ + entries_.size() * shard_format::index_entry_bytes;
    h.codec_name = codec_.name;
    h.codec_version = codec_.version;
    unsigned char rec[shard_format::index_entry_bytes];
    for (const auto& e : entries_) {
      shard_format::encode(e, rec);
      append(rec, sizeof rec);
    }
    flush();
    auto head = shard_format::encode(h);  // checksum field still 0, as the checksum defines it
    hash_.update(head.data(), head.size());
    h.checksum = hash_.digest();
    head = shard_format::encode(h);
    file_.write_at(0, head.data(), head.size());
    file_.commit();
    finalized_ = true;
    return {file_.target(), h.file_bytes, h.checksum, h.example_count, h.total_frames};
  }

  index_t size() const noexcept { return static_cast<index_t>(entries_.size()); }
  std::uint64_t bytes() const noexcept { return offset_ + entries_.size() * shard_format::index_entry_bytes; }
  const std::filesystem::path& path() const noexcept { return file_.target(); }

 private:
  static constexpr std::size_t flush_bytes = 1u << 20;

  static void check_conditions(const conditions& c, const std::string& where) {
    auto too_long = [](const std::string& s) { return s.size() > shard_format::max_string_bytes; };
    for (std::size_t i = 0; i < c.attributes.size(); ++i) {
      const auto& [k, v] = c.attributes[i];
      if (k.empty() || too_long(k) || too_long(v))
        throw data_error(where + ": attribute \"" + k + "\": keys must be non-empty, keys and values under 64 KiB");
      if (i > 0 && !(c.attributes[i - 1].first < k))
        throw data_error(where + ": attribute \"" + k + "\": attributes must be sorted with unique keys "
                         "(build them with conditions::set)");
    }
    if (c.caption && c.caption->size() > 16u * shard_format::max_string_bytes)
      throw data_error(where + ": field caption is longer than 1 MiB");
    if (c.embedding && (c.embedding->file.empty() || too_long(c.embedding->file)))
      throw data_error(where + ": field embedding.file must be a non-empty path under 64 KiB");
  }

  template <class Stored, class Int>
  void append_tokens(std::span<const Int> tokens) {
    // Convert in blocks: the buffer grows once per block, not once per token.
    Stored block[4096];
    std::size_t done = 0;
    while (done < tokens.size()) {
      const std::size_t n = std::min(tokens.size() - done, std::size(block));
      for (std::size_t i = 0; i < n; ++i) block[i] = static_cast<Stored>(tokens[done + i]);
      append(block, n * sizeof(Stored));
      done += n;
    }
  }

  void append(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    buffer_.insert(buffer_.end(), p, p + n);
    offset_ += n;
    if (buffer_.size() >= flush_bytes) flush();
  }
  void pad_to(std::uint64_t offset) {
    buffer_.resize(buffer_.size() + static_cast<std::size_t>(offset - offset_), 0);
    offset_ = offset;
  }
  void flush() {
    if (buffer_.empty()) return;
    // Everything past the reserved header is checksummed in file order.
    const std::uint64_t start = offset_ - buffer_.size();
    const std::uint64_t skip = hashed_from_ > start ? hashed_from_ - start : 0;
    hash_.update(buffer_.data() + skip, buffer_.size() - static_cast<std::size_t>(skip));
    file_.write(buffer_.data(), buffer_.size());
    buffer_.clear();
  }

  etude::detail::atomic_file file_;
  codec_spec codec_;
  std::uint32_t token_bytes_ = 2;
  std::uint64_t header_bytes_ = 0;
  std::uint64_t hashed_from_ = 0;
  std::uint64_t offset_ = 0;  // file offset of the next byte appended
  std::uint64_t total_frames_ = 0;
  std::vector<unsigned char> buffer_;
  std::vector<shard_format::index_entry> entries_;
  std::unordered_set<std::string> ids_;
  etude::detail::xxhash64 hash_;
  bool finalized_ = false;
};

}  // namespace etude::data
