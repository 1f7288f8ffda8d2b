// Reads one token shard in place through a read-only memory mapping: the header and index are
// checked on open (and the checksum over every byte, unless the caller opts out), then examples
// are handed out as views that decode tokens and metadata on access. Thread-safe for concurrent
// readers; nothing is copied until a caller copies.
// Not for: writing (shard_writer.hpp), or a split of many shards (dataset.hpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "etude/core/types.hpp"
#include "etude/data/conditions.hpp"
#include "etude/core/detail/posix_file.hpp"
#include "etude/core/detail/xxhash64.hpp"
#include "etude/data/error.hpp"
#include "etude/data/shard_format.hpp"

namespace etude::data {

// How much of a shard is proven on open: `checksum` hashes every byte (one sequential read of
// the file); `structure` checks header and index bounds only, for huge shards already verified.
enum class verify { checksum, structure };

// One example of an open shard; valid while its shard_reader lives.
class example_view {
 public:
  int codebooks() const noexcept { return codebooks_; }           // K
  index_t frames() const noexcept { return static_cast<index_t>(entry_.frames); }  // T_i
  index_t index() const noexcept { return index_; }               // position in the shard
  std::string_view id() const noexcept { return meta_.id; }
  const std::optional<std::string_view>& caption() const noexcept { return meta_.caption; }
  const std::vector<std::pair<std::string_view, std::string_view>>& attributes() const noexcept {
    return meta_.attributes;
  }
  std::optional<std::string_view> attribute(std::string_view key) const {
    for (const auto& [k, v] : meta_.attributes)
      if (k == key) return v;
    return std::nullopt;
  }
  std::optional<embedding_ref> embedding() const {
    if (!meta_.embedding_file) return std::nullopt;
    return embedding_ref{std::string(*meta_.embedding_file), meta_.embedding_row};
  }

  token_t token(int k, index_t t) const noexcept {
    const unsigned char* p = base_ + shard_format::token_offset(entry_, static_cast<std::uint64_t>(k),
                                                                static_cast<std::uint64_t>(t), token_bytes_);
    if (token_bytes_ == 2) {
      std::uint16_t v;
      std::memcpy(&v, p, 2);
      return static_cast<token_t>(v);
    }
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return static_cast<token_t>(v);
  }

  // Frames [first, first + count) of codebook k into out[0, count). The caller keeps the range
  // inside [0, frames()).
  void copy(int k, index_t first, index_t count, token_t* out) const noexcept {
    const unsigned char* p = base_ + shard_format::token_offset(entry_, static_cast<std::uint64_t>(k),
                                                                static_cast<std::uint64_t>(first), token_bytes_);
    if (token_bytes_ == 2) {
      const auto* s = reinterpret_cast<const std::uint16_t*>(p);  // aligned: checked on open
      for (index_t i = 0; i < count; ++i) out[i] = static_cast<token_t>(s[i]);
    } else {
      const auto* s = reinterpret_cast<const std::uint32_t*>(p);
      for (index_t i = 0; i < count; ++i) out[i] = static_cast<token_t>(s[i]);
    }
  }

  // The conditions as owned values, for a batch that outlives the shard.
  conditions owned_conditions() const {
    conditions c;
    c.attributes.reserve(meta_.attributes.size());
    for (const auto& [k, v] : meta_.attributes) c.attributes.emplace_back(std::string(k), std::string(v));
    if (meta_.caption) c.caption = std::string(*meta_.caption);
    c.embedding = embedding();
    return c;
  }

 private:
  friend class shard_reader;
  example_view(const unsigned char* base, shard_format::index_entry e, std::uint32_t token_bytes, int k, index_t i,
               shard_format::meta_view m)
      : base_(base), entry_(e), token_bytes_(token_bytes), codebooks_(k), index_(i), meta_(std::move(m)) {}

  const unsigned char* base_;
  shard_format::index_entry entry_;
  std::uint32_t token_bytes_;
  int codebooks_;
  index_t index_;
  shard_format::meta_view meta_;
};

class shard_reader {
 public:
  explicit shard_reader(const std::filesystem::path& path, verify mode = verify::checksum) : file_(path) {
    const std::string where = path.string();
    header_ = shard_format::decode_header(file_.data(), file_.size(), where);
    if (mode == verify::checksum) {
      file_.advise_sequential(true);
      const std::uint64_t sum = shard_format::checksum(file_.data(), header_.header_bytes, header_.file_bytes);
      if (sum != header_.checksum) {
        char want[17], got[17];
        throw data_error(where + ": checksum mismatch: the header records " +
                         std::string(etude::detail::hex64(header_.checksum, want)) + " but the bytes hash to " +
                         std::string(etude::detail::hex64(sum, got)) +
                         "; the shard is corrupt or was modified, re-copy or re-pack it");
      }
    }
    file_.advise_sequential(false);
    entries_.reserve(static_cast<std::size_t>(header_.example_count));
    std::uint64_t frames = 0;
    for (std::uint64_t i = 0; i < header_.example_count; ++i) {
      const auto e = shard_format::decode_entry(file_.data() + header_.index_offset + i * shard_format::index_entry_bytes);
      if (!shard_format::entry_fits(header_, e))
        throw data_error(where + ": example " + std::to_string(i) + ": index entry (tokens at " +
                         std::to_string(e.tokens_offset) + ", " + std::to_string(e.frames) + " frames; metadata at " +
                         std::to_string(e.meta_offset) + ", " + std::to_string(e.meta_bytes) +
                         " bytes) points outside the payload; the shard is corrupt, re-pack or re-copy it");
      frames += e.frames;
      entries_.push_back(e);
    }
    if (frames != header_.total_frames)
      throw data_error(where + ": header field total_frames = " + std::to_string(header_.total_frames) +
                       " but the index sums to " + std::to_string(frames) + "; the shard is corrupt, re-pack it");
  }

  index_t size() const noexcept { return static_cast<index_t>(entries_.size()); }
  int codebooks() const noexcept { return static_cast<int>(header_.codebooks); }
  int card() const noexcept { return static_cast<int>(header_.card); }
  double frame_rate() const noexcept { return header_.frame_rate; }
  const std::string& codec_name() const noexcept { return header_.codec_name; }
  const std::string& codec_version() const noexcept { return header_.codec_version; }
  std::uint64_t checksum() const noexcept { return header_.checksum; }
  std::uint64_t bytes() const noexcept { return header_.file_bytes; }
  std::uint64_t total_frames() const noexcept { return header_.total_frames; }
  const shard_format::header& header() const noexcept { return header_; }
  const std::filesystem::path& path() const noexcept { return file_.path(); }

  // T_i, without decoding the metadata.
  index_t frames(index_t i) const {
    check_index(i);
    return static_cast<index_t>(entries_[static_cast<std::size_t>(i)].frames);
  }

  example_view example(index_t i) const {
    check_index(i);
    const auto& e = entries_[static_cast<std::size_t>(i)];
    auto meta = shard_format::decode_meta(file_.data() + e.meta_offset, e.meta_bytes,
                                          file_.path().string() + ": example " + std::to_string(i));
    return example_view(file_.data(), e, header_.token_bytes, codebooks(), i, std::move(meta));
  }

 private:
  void check_index(index_t i) const {
    if (i < 0 || i >= size())
      throw invalid_argument(file_.path().string() + ": example " + std::to_string(i) + " requested but the shard has " +
                             std::to_string(size()) + " examples");
  }

  etude::detail::mapped_file file_;
  shard_format::header header_;
  std::vector<shard_format::index_entry> entries_;
};

}  // namespace etude::data
