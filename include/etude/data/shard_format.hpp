// The token shard layout (docs/token-shards.md is the prose version): constants, the header and
// index records with their little-endian encoding, the checksum, and the bounds arithmetic a
// reader needs before it trusts an offset. Kept apart from the writer and the reader so both,
// and any independent implementation (a test, a Python script), share one statement of it.
// Not for: file I/O (shard_writer.hpp, shard_reader.hpp).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "etude/data/conditions.hpp"
#include "etude/core/detail/xxhash64.hpp"
#include "etude/data/error.hpp"

namespace etude::data::shard_format {

static_assert(std::endian::native == std::endian::little,
              "etude's token shards are little-endian and read in place; big-endian hosts are not supported");

inline constexpr char magic[8] = {'E', 'T', 'U', 'D', 'E', 'T', 'O', 'K'};
inline constexpr std::uint32_t version = 1;
inline constexpr std::uint64_t fixed_header_bytes = 128;
inline constexpr std::uint64_t index_entry_bytes = 32;
inline constexpr std::uint64_t token_alignment = 64;  // each [K, T_i] array starts on a cache line
inline constexpr std::uint64_t checksum_field = 80;   // byte offset of the checksum in the header
inline constexpr std::uint32_t max_string_bytes = 1u << 16;

// Tokens are stored as uint16 when every id of the codebook and the special token C fit, else
// uint32 (ids are below 2^31 either way: etude::token_t is int32).
constexpr std::uint32_t token_bytes_for_card(std::int64_t card) { return card + 1 <= 65536 ? 2u : 4u; }

constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

struct header {
  std::uint32_t format_version = version;
  std::uint32_t header_bytes = 0;     // fixed part + codec strings, padded to token_alignment
  std::uint32_t codebooks = 0;        // K
  std::uint32_t card = 0;             // C
  std::uint32_t token_bytes = 0;      // 2 or 4
  std::uint32_t flags = 0;            // reserved, 0
  double frame_rate = 0;              // codec frames per second
  std::uint64_t example_count = 0;
  std::uint64_t total_frames = 0;     // sum of T_i
  std::uint64_t payload_offset = 0;   // == header_bytes
  std::uint64_t index_offset = 0;     // example_count entries of index_entry_bytes
  std::uint64_t file_bytes = 0;       // index_offset + example_count * index_entry_bytes
  std::uint64_t checksum = 0;
  std::string codec_name;
  std::string codec_version;
};

struct index_entry {
  std::uint64_t tokens_offset = 0;  // absolute; K * frames * token_bytes bytes, codebook-major
  std::uint64_t frames = 0;         // T_i
  std::uint64_t meta_offset = 0;    // absolute; the metadata record (id, conditions)
  std::uint64_t meta_bytes = 0;
};

namespace detail {
inline void put32(unsigned char* p, std::uint32_t v) { std::memcpy(p, &v, 4); }
inline void put64(unsigned char* p, std::uint64_t v) { std::memcpy(p, &v, 8); }
inline std::uint32_t get32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline std::uint64_t get64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
}  // namespace detail

constexpr std::uint64_t header_bytes_for(std::uint64_t codec_name_bytes, std::uint64_t codec_version_bytes) {
  return align_up(fixed_header_bytes + codec_name_bytes + codec_version_bytes, token_alignment);
}

// The header as stored: exactly h.header_bytes bytes.
inline std::vector<unsigned char> encode(const header& h) {
  std::vector<unsigned char> out(h.header_bytes, 0);
  unsigned char* p = out.data();
  std::memcpy(p, magic, 8);
  detail::put32(p + 8, h.format_version);
  detail::put32(p + 12, h.header_bytes);
  detail::put32(p + 16, h.codebooks);
  detail::put32(p + 20, h.card);
  detail::put32(p + 24, h.token_bytes);
  detail::put32(p + 28, h.flags);
  std::memcpy(p + 32, &h.frame_rate, 8);
  detail::put64(p + 40, h.example_count);
  detail::put64(p + 48, h.total_frames);
  detail::put64(p + 56, h.payload_offset);
  detail::put64(p + 64, h.index_offset);
  detail::put64(p + 72, h.file_bytes);
  detail::put64(p + checksum_field, h.checksum);
  detail::put32(p + 88, static_cast<std::uint32_t>(h.codec_name.size()));
  detail::put32(p + 92, static_cast<std::uint32_t>(h.codec_version.size()));
  std::memcpy(p + fixed_header_bytes, h.codec_name.data(), h.codec_name.size());
  std::memcpy(p + fixed_header_bytes + h.codec_name.size(), h.codec_version.data(), h.codec_version.size());
  return out;
}

inline void encode(const index_entry& e, unsigned char* out) {
  detail::put64(out, e.tokens_offset);
  detail::put64(out + 8, e.frames);
  detail::put64(out + 16, e.meta_offset);
  detail::put64(out + 24, e.meta_bytes);
}
inline index_entry decode_entry(const unsigned char* p) {
  return {detail::get64(p), detail::get64(p + 8), detail::get64(p + 16), detail::get64(p + 24)};
}

// Parses and checks a header against the real file size: everything a reader relies on before it
// touches the index (magic, version, K, card, token width, frame rate, and that header, payload
// and index tile the file exactly). `where` names the file in messages.
inline header decode_header(const unsigned char* p, std::uint64_t size, const std::string& where) {
  if (size < fixed_header_bytes)
    throw data_error(where + ": not a token shard or truncated: " + std::to_string(size) +
                     " bytes, shorter than the " + std::to_string(fixed_header_bytes) +
                     "-byte header; re-pack or re-copy the shard");
  if (std::memcmp(p, magic, 8) != 0)
    throw data_error(where + ": not an etude token shard (wrong magic bytes; expected \"ETUDETOK\"); "
                     "check that the manifest points at shard files written by shard_writer or pack_tokens");
  header h;
  h.format_version = detail::get32(p + 8);
  if (h.format_version != version)
    throw data_error(where + ": shard format version " + std::to_string(h.format_version) +
                     " is not supported (this etude reads version " + std::to_string(version) +
                     "); re-pack the dataset with this etude's pack_tokens or upgrade etude");
  h.header_bytes = detail::get32(p + 12);
  h.codebooks = detail::get32(p + 16);
  h.card = detail::get32(p + 20);
  h.token_bytes = detail::get32(p + 24);
  h.flags = detail::get32(p + 28);
  std::memcpy(&h.frame_rate, p + 32, 8);
  h.example_count = detail::get64(p + 40);
  h.total_frames = detail::get64(p + 48);
  h.payload_offset = detail::get64(p + 56);
  h.index_offset = detail::get64(p + 64);
  h.file_bytes = detail::get64(p + 72);
  h.checksum = detail::get64(p + checksum_field);
  const std::uint32_t name_bytes = detail::get32(p + 88);
  const std::uint32_t codec_version_bytes = detail::get32(p + 92);
  auto bad = [&](const std::string& what) {
    return data_error(where + ": corrupt shard header: " + what + "; re-pack or re-copy the shard");
  };
  if (h.file_bytes != size)
    throw data_error(where + ": truncated or extended: the header says " + std::to_string(h.file_bytes) +
                     " bytes but the file has " + std::to_string(size) +
                     "; the copy is incomplete or the file was modified, re-copy or re-pack it");
  if (h.codebooks == 0 || h.codebooks > 65535) throw bad("field codebooks (K) = " + std::to_string(h.codebooks));
  if (h.card == 0 || h.card > 0x7fffffffu) throw bad("field card = " + std::to_string(h.card));
  if (h.token_bytes != token_bytes_for_card(h.card))
    throw bad("field token_bytes = " + std::to_string(h.token_bytes) + " does not match card " +
              std::to_string(h.card) + " (expected " + std::to_string(token_bytes_for_card(h.card)) + ")");
  if (!(h.frame_rate > 0) || !(h.frame_rate < 1e9)) throw bad("field frame_rate = " + std::to_string(h.frame_rate));
  if (h.flags != 0) throw bad("field flags = " + std::to_string(h.flags) + " (reserved, must be 0)");
  if (name_bytes > max_string_bytes || codec_version_bytes > max_string_bytes ||
      h.header_bytes != header_bytes_for(name_bytes, codec_version_bytes) || h.header_bytes > size)
    throw bad("field header_bytes = " + std::to_string(h.header_bytes) + " for codec strings of " +
              std::to_string(name_bytes) + " + " + std::to_string(codec_version_bytes) + " bytes");
  if (h.payload_offset != h.header_bytes) throw bad("field payload_offset = " + std::to_string(h.payload_offset));
  // Index tiles the end of the file exactly; the division avoids overflow on hostile counts.
  if (h.index_offset < h.payload_offset || h.index_offset > size || h.index_offset % 8 != 0 ||
      (size - h.index_offset) / index_entry_bytes != h.example_count || (size - h.index_offset) % index_entry_bytes != 0)
    throw bad("fields index_offset = " + std::to_string(h.index_offset) + " and example_count = " +
              std::to_string(h.example_count) + " do not tile a file of " + std::to_string(size) + " bytes");
  h.codec_name.assign(reinterpret_cast<const char*>(p + fixed_header_bytes), name_bytes);
  h.codec_version.assign(reinterpret_cast<const char*>(p + fixed_header_bytes + name_bytes), codec_version_bytes);
  return h;
}

// Bytes of one example's token array. Callers check `frames` first (entry_fits), so no overflow.
constexpr std::uint64_t token_array_bytes(std::uint64_t codebooks, std::uint64_t frames, std::uint64_t token_bytes) {
  return codebooks * frames * token_bytes;
}
// Absolute byte offset of token (k, t) of an example: 64-bit throughout, so shards and single
// examples beyond 4 GiB address correctly.
constexpr std::uint64_t token_offset(const index_entry& e, std::uint64_t k, std::uint64_t t, std::uint64_t token_bytes) {
  return e.tokens_offset + (k * e.frames + t) * token_bytes;
}

// Whether an index entry lies inside the payload: token array aligned to its element size, both
// ranges within [payload_offset, index_offset). Written to be overflow-free for any 64-bit input.
inline bool entry_fits(const header& h, const index_entry& e) {
  const std::uint64_t lo = h.payload_offset, hi = h.index_offset;
  if (e.frames == 0) return false;
  if (e.tokens_offset < lo || e.tokens_offset > hi || e.tokens_offset % h.token_bytes != 0) return false;
  const std::uint64_t room = hi - e.tokens_offset;
  if (e.frames > room / (std::uint64_t{h.codebooks} * h.token_bytes)) return false;
  if (e.meta_offset < lo || e.meta_offset > hi || e.meta_bytes > hi - e.meta_offset) return false;
  return true;
}

// The shard checksum: XXH64 (seed 0) over the bytes after the header (payload, then index), in
// file order, followed by the header with its checksum field read as zero. That order lets a
// writer hash while streaming and patch the header last.
inline std::uint64_t checksum(const unsigned char* file, std::uint64_t header_bytes, std::uint64_t file_bytes) {
  etude::detail::xxhash64 h;
  // Feed in slices so a 32-bit size_t could not truncate, and large mappings stream through.
  constexpr std::uint64_t slice = 1ull << 30;
  for (std::uint64_t at = header_bytes; at < file_bytes; at += slice)
    h.update(file + at, static_cast<std::size_t>(std::min(slice, file_bytes - at)));
  std::vector<unsigned char> head(file, file + header_bytes);
  detail::put64(head.data() + checksum_field, 0);
  h.update(head.data(), head.size());
  return h.digest();
}

// --- the per-example metadata record ---------------------------------------------------------
//   u32 flags (bit 0: caption present, bit 1: embedding reference present)
//   u32 n + n bytes: example id (UTF-8, non-empty)
//   [u32 n + n bytes: caption]                    if bit 0
//   [u32 n + n bytes: embedding file, u64 row]    if bit 1
//   u32 attribute count, then per attribute: u32 n + key, u32 n + value (keys sorted, unique)
inline constexpr std::uint32_t meta_has_caption = 1u;
inline constexpr std::uint32_t meta_has_embedding = 2u;

// The record of one example. Attributes must already be sorted with unique keys (conditions keeps
// them so); the writer checks lengths before calling this.
inline std::vector<unsigned char> encode_meta(std::string_view id, const conditions& c) {
  std::vector<unsigned char> out;
  auto u32 = [&](std::uint32_t v) {
    unsigned char b[4];
    detail::put32(b, v);
    out.insert(out.end(), b, b + 4);
  };
  auto str = [&](std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  };
  u32((c.caption ? meta_has_caption : 0u) | (c.embedding ? meta_has_embedding : 0u));
  str(id);
  if (c.caption) str(*c.caption);
  if (c.embedding) {
    str(c.embedding->file);
    unsigned char b[8];
    detail::put64(b, c.embedding->row);
    out.insert(out.end(), b, b + 8);
  }
  u32(static_cast<std::uint32_t>(c.attributes.size()));
  for (const auto& [k, v] : c.attributes) {
    str(k);
    str(v);
  }
  return out;
}

// A decoded record whose strings point into the shard's mapping.
struct meta_view {
  std::string_view id;
  std::optional<std::string_view> caption;
  std::optional<std::string_view> embedding_file;
  std::uint64_t embedding_row = 0;
  std::vector<std::pair<std::string_view, std::string_view>> attributes;  // sorted by key
};

// `where` names the shard and example in messages; every length is checked against the record.
inline meta_view decode_meta(const unsigned char* p, std::uint64_t n, const std::string& where) {
  std::uint64_t at = 0;
  auto fail = [&](const char* field) {
    return data_error(where + ": metadata record is corrupt at field " + field + " (record of " + std::to_string(n) +
                      " bytes); the shard is damaged, re-pack or re-copy it");
  };
  auto u32 = [&](const char* field) {
    if (n - at < 4) throw fail(field);
    const std::uint32_t v = detail::get32(p + at);
    at += 4;
    return v;
  };
  auto str = [&](const char* field) {
    const std::uint32_t len = u32(field);
    if (n - at < len) throw fail(field);
    std::string_view s(reinterpret_cast<const char*>(p + at), len);
    at += len;
    return s;
  };
  meta_view m;
  const std::uint32_t flags = u32("flags");
  if ((flags & ~(meta_has_caption | meta_has_embedding)) != 0) throw fail("flags");
  m.id = str("id");
  if (m.id.empty()) throw fail("id");
  if ((flags & meta_has_caption) != 0) m.caption = str("caption");
  if ((flags & meta_has_embedding) != 0) {
    m.embedding_file = str("embedding.file");
    if (n - at < 8) throw fail("embedding.row");
    m.embedding_row = detail::get64(p + at);
    at += 8;
  }
  const std::uint32_t count = u32("attributes");
  if (count > (n - at) / 8) throw fail("attributes");  // each needs at least two length words
  m.attributes.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::string_view k = str("attribute key");
    const std::string_view v = str("attribute value");
    if (!m.attributes.empty() && !(m.attributes.back().first < k)) throw fail("attribute key order");
    m.attributes.emplace_back(k, v);
  }
  if (at != n) throw fail("end of record");
  return m;
}

}  // namespace etude::data::shard_format
