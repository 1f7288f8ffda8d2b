// What a training step consumes: codec tokens (B, K, T) and their padding mask, as a non-owning
// view (the data loader's buffers, a user's arrays) or an owning batch.
#pragma once

#include <vector>

#include "etude/core/types.hpp"

namespace etude {

struct batch_view {
  const token_t* tokens = nullptr;      // (B, K, T) ids in [0, card)
  const unsigned char* mask = nullptr;  // (B, K, T) 1 = real frame, 0 = padding; nullptr = all real
  index_t batch = 0;                    // B
  int codebooks = 0;                    // K
  index_t frames = 0;                   // T

  bool valid(index_t b, int k, index_t t) const {
    return mask == nullptr || mask[(b * codebooks + k) * frames + t] != 0;
  }
  token_t token(index_t b, int k, index_t t) const { return tokens[(b * codebooks + k) * frames + t]; }
};

struct token_batch {
  std::vector<token_t> tokens;      // (B, K, T)
  std::vector<unsigned char> mask;  // (B, K, T), empty = all real
  index_t batch = 0;
  int codebooks = 0;
  index_t frames = 0;

  token_batch() = default;
  token_batch(index_t b, int k, index_t t)
      : tokens(static_cast<std::size_t>(b * k * t)), mask(static_cast<std::size_t>(b * k * t), 1), batch(b),
        codebooks(k), frames(t) {}

  token_t& at(index_t b, int k, index_t t) { return tokens[static_cast<std::size_t>((b * codebooks + k) * frames + t)]; }
  unsigned char& mask_at(index_t b, int k, index_t t) {
    return mask[static_cast<std::size_t>((b * codebooks + k) * frames + t)];
  }
  token_t at(index_t b, int k, index_t t) const {
    return tokens[static_cast<std::size_t>((b * codebooks + k) * frames + t)];
  }

  batch_view view() const { return {tokens.data(), mask.empty() ? nullptr : mask.data(), batch, codebooks, frames}; }
  operator batch_view() const { return view(); }  // NOLINT: a batch is usable wherever its view is
};

}  // namespace etude
