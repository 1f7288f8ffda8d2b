// A batch as the loader delivers it: an etude::token_batch (tokens and padding mask, (B, K, T),
// so trainer.step(batch) takes it as is) plus what each row came from and is conditioned on:
// example id, conditions, split-wide index, crop offset and real length. Optionally a second
// copy of tokens and mask in memory from the loader's host_allocator (pinned, for a device).
// Not for: building batches (loader.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "etude/core/types.hpp"
#include "etude/data/conditions.hpp"
#include "etude/data/host_allocator.hpp"
#include "etude/core/batch.hpp"

namespace etude::data {

struct loaded_batch : token_batch {
  std::vector<std::string> ids;                     // (B) example ids
  std::vector<etude::data::conditions> conditions;  // (B)
  std::vector<index_t> examples;                    // (B) split-wide example index
  std::vector<index_t> offsets;                     // (B) first frame of the crop within the example
  std::vector<index_t> lengths;                     // (B) real frames; frames [length, T) are padding
  std::uint64_t epoch = 0;
  std::uint64_t index = 0;  // position of this batch in its epoch, for this rank
  bool last_in_epoch = false;
  // tokens (B, K, T) int32 followed by mask (B, K, T) uint8, in host_allocator memory; empty when
  // the loader has no allocator (then staged() is view()).
  host_block staging;

  loaded_batch() = default;
  loaded_batch(index_t b, int k, index_t t) : token_batch(b, k, t) {}

  batch_view staged() const {
    batch_view v = view();
    if (ids.size() == static_cast<std::size_t>(batch)) v.ids = ids.data();
    if (staging.empty()) return v;
    const auto* base = static_cast<const unsigned char*>(staging.data());
    // The block holds what stage() copied: tokens, then the mask (none when the mask is empty).
    const std::size_t token_bytes = tokens.size() * sizeof(token_t);
    const std::size_t mask_bytes = staging.bytes() > token_bytes ? staging.bytes() - token_bytes : 0;
    v.tokens = reinterpret_cast<const token_t*>(base);
    v.mask = mask.empty() ? nullptr : base + token_bytes;
    v.tokens_size = std::min(tokens.size(), staging.bytes() / sizeof(token_t));
    v.mask_size = std::min(mask.size(), mask_bytes);
    return v;
  }

  // Fills `staging` from tokens and mask (the loader does this on its worker threads).
  void stage(std::shared_ptr<host_allocator> allocator) {
    const std::size_t token_bytes = tokens.size() * sizeof(token_t);
    staging = host_block(std::move(allocator), token_bytes + mask.size());
    auto* base = static_cast<unsigned char*>(staging.data());
    std::memcpy(base, tokens.data(), token_bytes);
    std::memcpy(base + token_bytes, mask.data(), mask.size());
  }
};

}  // namespace etude::data
