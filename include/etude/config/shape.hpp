// The model shape as a compile-time value: a structural struct used directly as a template
// argument, filled with designated initialisers,
//   etude::shape{.codebooks = 4, .card = 2048, .dim = 512, .heads = 8, .layers = 8}.
// Validation lives in etude::model, where the whole configuration is known.
#pragma once

#include "etude/core/types.hpp"

namespace etude {

struct shape {
  int codebooks = 4;    // K: parallel token streams of the codec
  int card = 2048;      // C: entries per codebook; the special token is id C
  int dim = 512;        // model width
  int heads = 8;        // attention heads; dim / heads is the head dimension
  int layers = 8;       // transformer layers
  int ffn_mult = 4;     // FFN hidden width = ffn_mult * dim
  int max_len = 4096;   // the longest pattern sequence S a batch may produce

  constexpr int head_dim() const { return heads > 0 ? dim / heads : 0; }
  constexpr int ffn() const { return ffn_mult * dim; }
  constexpr bool operator==(const shape&) const = default;
};

}  // namespace etude
