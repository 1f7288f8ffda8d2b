// What a training step consumes: codec tokens (B, K, T) and their padding mask, and for a
// conditioned model (config/conditions.hpp) each example's conditions as the model takes them —
// attribute value indices (−1: the null condition) and precomputed embeddings with their padding
// mask — as a non-owning view (the data loader's buffers, a user's arrays) or an owning batch.
// A view also carries how many elements its buffers hold, so that check_batch_buffers (and the
// trainer's check_batch) refuses a view whose dimensions promise more than its buffers have
// before anything reads them. Views of a token_batch fill these in; a view over a caller's own
// arrays should too (left at `unknown_size`, the caller vouches for B·K·T).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude {

struct batch_view {
  static constexpr std::size_t unknown_size = std::numeric_limits<std::size_t>::max();

  const token_t* tokens = nullptr;      // (B, K, T) ids in [0, card)
  const unsigned char* mask = nullptr;  // (B, K, T) 1 = real frame, 0 = padding; nullptr = all real
  index_t batch = 0;                    // B
  int codebooks = 0;                    // K
  index_t frames = 0;                   // T
  std::size_t tokens_size = unknown_size;  // elements `tokens` points to
  std::size_t mask_size = unknown_size;    // elements `mask` points to (when it is not nullptr)
  // conditions (conditioned models only; config/conditions.hpp gives the layout)
  const std::int32_t* attributes = nullptr;        // (B, attributes) value index, −1 = null condition
  const float* embeddings = nullptr;               // (B, embedding_values) every embedding in list order,
                                                   // each (max_len, width); nullptr = every embedding null
  const unsigned char* embedding_mask = nullptr;   // (B, embedding_positions) 1 = real position;
                                                   // nullptr = every position real
  std::size_t attributes_size = unknown_size;
  std::size_t embeddings_size = unknown_size;
  std::size_t embedding_mask_size = unknown_size;
  const std::string* ids = nullptr;  // (B) the examples' ids, optional: errors name them

  bool valid(index_t b, int k, index_t t) const {
    return mask == nullptr || mask[(b * codebooks + k) * frames + t] != 0;
  }
  token_t token(index_t b, int k, index_t t) const { return tokens[(b * codebooks + k) * frames + t]; }
};

struct token_batch {
  std::vector<token_t> tokens;      // (B, K, T)
  std::vector<unsigned char> mask;  // (B, K, T), empty = all real
  std::vector<std::int32_t> attributes;          // (B, attributes), conditioned models
  std::vector<float> embeddings;                 // (B, embedding_values), empty = none
  std::vector<unsigned char> embedding_mask;     // (B, embedding_positions), empty = all real
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

  batch_view view() const {
    batch_view v{tokens.data(), mask.empty() ? nullptr : mask.data(), batch, codebooks, frames, tokens.size(),
                 mask.size()};
    if (!attributes.empty()) v.attributes = attributes.data();
    if (!embeddings.empty()) v.embeddings = embeddings.data();
    if (!embedding_mask.empty()) v.embedding_mask = embedding_mask.data();
    v.attributes_size = attributes.size();
    v.embeddings_size = embeddings.size();
    v.embedding_mask_size = embedding_mask.size();
    return v;
  }
  operator batch_view() const { return view(); }  // NOLINT: a batch is usable wherever its view is

  // Examples [first, first + count) with everything they carry (tokens, mask, conditions): a
  // microbatch, or a data-parallel rank's share of a global batch.
  token_batch examples(index_t first, index_t count) const {
    if (first < 0 || count < 0 || first + count > batch)
      throw invalid_argument("token_batch::examples: [" + std::to_string(first) + ", " + std::to_string(first + count) +
                             ") is not within the batch's " + std::to_string(batch) + " examples");
    token_batch out;
    out.batch = count;
    out.codebooks = codebooks;
    out.frames = frames;
    auto take = [&](const auto& from, auto& to) {
      if (from.empty() || batch == 0) return;
      const auto per = static_cast<std::ptrdiff_t>(from.size() / static_cast<std::size_t>(batch));
      to.assign(from.begin() + first * per, from.begin() + (first + count) * per);
    };
    take(tokens, out.tokens);
    take(mask, out.mask);
    take(attributes, out.attributes);
    take(embeddings, out.embeddings);
    take(embedding_mask, out.embedding_mask);
    return out;
  }
  // Rank `rank`'s share of a global batch split evenly over `ranks` (examples [rank·B/ranks, ...)),
  // as a data-parallel trainer expects it (train/communicator.hpp).
  token_batch share(int rank, int ranks) const {
    if (ranks <= 0 || rank < 0 || rank >= ranks || batch % ranks != 0)
      throw invalid_argument("token_batch::share: rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                             ": a batch of " + std::to_string(batch) + " examples splits evenly over " +
                             "a number of ranks that divides it");
    return examples(rank * (batch / ranks), batch / ranks);
  }
};

// Throws invalid_input, naming `what` ("training batch"), the field and both sizes, when the
// view's dimensions are negative, overflow, or ask for more elements than its buffers hold.
// Reads no element: call it before anything else looks at the buffers.
inline void check_batch_buffers(const batch_view& b, const std::string& what) {
  const std::string dims = "batch " + std::to_string(b.batch) + " x codebooks " + std::to_string(b.codebooks) +
                           " x frames " + std::to_string(b.frames);
  if (b.batch < 0 || b.codebooks < 0 || b.frames < 0)
    throw invalid_input(what + ": negative dimension (" + dims + ")");
  // Overflow checked by division (no compiler builtins: nvcc reads this header too).
  constexpr index_t most = std::numeric_limits<index_t>::max();
  const index_t bk = static_cast<index_t>(b.codebooks);
  if ((bk != 0 && b.batch > most / bk) || (b.batch * bk != 0 && b.frames > most / (b.batch * bk)))
    throw invalid_input(what + ": " + dims + " overflows a 64-bit element count");
  const auto need = static_cast<std::size_t>(b.batch * bk * b.frames);
  auto short_of = [&](const char* field, std::size_t have) {
    return invalid_input(what + ": field " + field + " holds " + std::to_string(have) + " elements but " + dims +
                         " needs " + std::to_string(need) + "; fill " + field + " for every (example, codebook, " +
                         "frame), or fix the dimensions");
  };
  if (b.tokens != nullptr && b.tokens_size != batch_view::unknown_size && b.tokens_size < need)
    throw short_of("tokens", b.tokens_size);
  if (b.mask != nullptr && b.mask_size != batch_view::unknown_size && b.mask_size < need)
    throw short_of("mask", b.mask_size);
}

}  // namespace etude
