// Reads precomputed condition embeddings (MiniLM, T5, CLAP token states, computed outside etude)
// that shard examples reference by embedding_ref{file, row}: `file`, relative to the dataset
// directory, is a .npy float32 or float16 array (rows, L, width), and beside it `<stem>.mask.npy`
// is its padding mask (rows, L), uint8 or bool, 1 = real position (docs/token-shards.md,
// "Condition embeddings"). Each file is mapped once and kept open; rows are copied into a batch's
// (max_len, width) block with padded positions zeroed, after checking width, row, mask values,
// real length against max_len and finiteness. Safe to share between threads.
// Not for: computing embeddings (tools/embed_captions.py) or choosing which condition a file
// feeds (condition_encoder.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "etude/core/dtype.hpp"
#include "etude/data/conditions.hpp"
#include "etude/data/error.hpp"
#include "etude/data/npy.hpp"

namespace etude::data {

struct embedding_options {
  // An embedding whose real positions run past the condition's max_len is refused (false), or
  // keeps its first max_len positions (true).
  bool truncate = false;
};

// The mask file that goes with an embedding file: "text.npy" -> "text.mask.npy".
inline std::filesystem::path embedding_mask_path(const std::filesystem::path& file) {
  auto p = file;
  return p.replace_extension(".mask.npy");
}

class embedding_store {
 public:
  explicit embedding_store(std::filesystem::path root, embedding_options options = {})
      : root_(std::move(root)), options_(options) {}

  const std::filesystem::path& root() const noexcept { return root_; }
  const embedding_options& options() const noexcept { return options_; }

  // Copies row ref.row of ref.file into out (max_len, width) and mask (max_len): real positions as
  // stored (float16 widened), padded ones and those past the file's L as zeros with mask 0.
  // `example` and `condition` name the example id and the condition in messages. On a throw,
  // `out` and `mask` may be partly written: the caller fills scratch space (the encoder does).
  void read(const embedding_ref& ref, int width, int max_len, std::string_view example, std::string_view condition,
            float* out, unsigned char* mask) const {
    const std::string who = "embedding '" + std::string(condition) + "' of example " + std::string(example);
    const entry& e = open(ref.file, who);
    const std::string file = e.values.path().string();
    const auto& vs = e.values.shape();  // (rows, L, W)
    const std::uint64_t rows = vs[0], L = vs[1], W = vs[2];
    if (W != static_cast<std::uint64_t>(width))
      throw data_error(who + ": file " + file + " has width " + std::to_string(W) + ", the model takes " +
                       std::to_string(width) + "; embed with an encoder of that width, or set cond::embedding<\"" +
                       std::string(condition) + "\", " + std::to_string(W) + ", max_len>");
    if (ref.row >= rows)
      throw data_error(who + ": row " + std::to_string(ref.row) + " is out of range, file " + file + " has " +
                       std::to_string(rows) + " rows; the shard and the embedding file are out of step, "
                       "re-run the embedding tool and re-pack");
    const unsigned char* m = e.mask.data() + ref.row * L;
    std::uint64_t real = 0;  // one past the last real position
    for (std::uint64_t p = 0; p < L; ++p) {
      if (m[p] > 1)
        throw data_error(who + ": mask file " + e.mask.path().string() + ", row " + std::to_string(ref.row) +
                         ", position " + std::to_string(p) + " holds " + std::to_string(m[p]) +
                         "; a mask holds 0 (padding) or 1 (real)");
      if (m[p] != 0) real = p + 1;
    }
    const auto cap = static_cast<std::uint64_t>(max_len);
    if (real > cap && !options_.truncate)
      throw data_error(who + ": file " + file + ", row " + std::to_string(ref.row) + " has " + std::to_string(real) +
                       " real positions but the model takes at most " + std::to_string(max_len) +
                       "; raise cond::embedding's MaxLen, embed shorter text, or set embedding_options::truncate "
                       "to keep the first " + std::to_string(max_len));
    const std::uint64_t keep = std::min(L, cap);
    const unsigned char* row = e.values.data() + ref.row * L * W * static_cast<std::uint64_t>(e.values.element_bytes());
    std::fill_n(out, static_cast<std::size_t>(cap * W), 0.0f);
    std::fill_n(mask, static_cast<std::size_t>(cap), static_cast<unsigned char>(0));
    for (std::uint64_t p = 0; p < keep; ++p) {
      if (m[p] == 0) continue;
      mask[p] = 1;
      float* dst = out + p * W;
      for (std::uint64_t i = 0; i < W; ++i) {
        float v;
        if (e.values.element_bytes() == 4) {
          std::memcpy(&v, row + (p * W + i) * 4, 4);
        } else {
          std::uint16_t h;
          std::memcpy(&h, row + (p * W + i) * 2, 2);
          v = etude::detail::fp16_bits_to_float(h);
        }
        if (!std::isfinite(v))
          throw data_error(who + ": file " + file + ", row " + std::to_string(ref.row) + ", position " +
                           std::to_string(p) + ", value " + std::to_string(i) + " is not finite (" +
                           std::to_string(v) + "); re-run the encoder (a float16 file may have overflowed: "
                           "save float32)");
        dst[i] = v;
      }
    }
  }

 private:
  struct entry {
    npy_mapped values;
    npy_mapped mask;
  };

  const entry& open(const std::string& file, const std::string& who) const {
    std::lock_guard lock(mutex_);
    if (const auto it = files_.find(file); it != files_.end()) return *it->second;
    const std::filesystem::path rel(file);
    bool inside = !file.empty() && rel.is_relative();
    for (const auto& part : rel) inside = inside && part != "..";
    if (!inside)
      throw data_error(who + ": embedding file \"" + file +
                       "\" is not a path inside the dataset directory (absolute, empty or with \"..\"); "
                       "store embeddings beside the manifest and name them relative to it");
    const auto path = root_ / rel;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
      throw data_error(who + ": embedding file " + path.string() +
                       " does not exist; run tools/embed_captions.py (or your encoder) into the dataset directory");
    const auto mask_path = embedding_mask_path(path);
    if (!std::filesystem::exists(mask_path, ec))
      throw data_error(who + ": mask file " + mask_path.string() + " for embedding file " + path.string() +
                       " does not exist; save the encoder's attention mask (rows, L) as uint8 beside it");
    std::unique_ptr<entry> e;
    try {
      e = std::make_unique<entry>(entry{npy_mapped(path), npy_mapped(mask_path)});
    } catch (const data_error& x) {
      throw data_error(who + ": " + x.what());
    }
    const auto& vs = e->values.shape();
    if (vs.size() != 3 || e->values.kind() != 'f' || e->values.element_bytes() == 8)
      throw data_error(who + ": embedding file " + path.string() + " holds " + e->values.header().descr + " " +
                       e->values.shape_text() + "; expected float32 or float16 (rows, max_len, width): "
                       "save with a.astype('<f4') and one row per example");
    const auto& ms = e->mask.shape();
    if (ms.size() != 2 || e->mask.element_bytes() != 1 || (e->mask.kind() != 'u' && e->mask.kind() != 'b'))
      throw data_error(who + ": mask file " + mask_path.string() + " holds " + e->mask.header().descr + " " +
                       e->mask.shape_text() + "; expected uint8 or bool (rows, max_len)");
    if (ms[0] != vs[0] || ms[1] != vs[1])
      throw data_error(who + ": mask file " + mask_path.string() + " has shape " + e->mask.shape_text() +
                       " but embedding file " + path.string() + " has " + e->values.shape_text() +
                       "; the mask must be (rows, max_len) of the same rows and length, re-write both together");
    const entry& out = *e;
    files_.emplace(file, std::move(e));
    return out;
  }

  std::filesystem::path root_;
  embedding_options options_;
  mutable std::mutex mutex_;
  mutable std::map<std::string, std::unique_ptr<entry>> files_;
};

}  // namespace etude::data
