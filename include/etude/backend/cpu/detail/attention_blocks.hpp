// How the CPU's self-attention cuts a sequence (attention.hpp and its AVX-512 kernels,
// kernels/avx512_attention.hpp): query rows per block, the kernels' blocks and the score rows' stride,
// from cpu_tuning<cpu_op::attention>. Not the attention itself.
#pragma once

#include "etude/backend/cpu/kernels/avx512_vmath.hpp"
#include "etude/backend/cpu/tuning.hpp"
#include "etude/core/types.hpp"

namespace etude::backend::cpu_detail {

struct attention_blocks {
  // Query rows go in blocks of `attention_rows(S)`; a block only meets the keys at or before its
  // last row, so the masked upper triangle is never computed (beyond the diagonal blocks).
  using attention_tuning = cpu_tuning<cpu_op::attention>;  // tuning.hpp
  static constexpr index_t max_attention_rows = attention_tuning::max_rows;
  static constexpr index_t attention_rows(index_t steps) {
    return steps > attention_tuning::long_steps ? max_attention_rows : attention_tuning::rows;
  }
  // The AVX-512 kernels' blocks (at most attention_rows(steps), which sizes the scratch).
  static constexpr index_t dot_rows = cpu_tuning<cpu_op::attention, void, 0, cpu_isa::avx512_bf16>::dot_rows;
  static_assert(attention_tuning::rows <= max_attention_rows && dot_rows <= attention_tuning::rows,
                "cpu_tuning<cpu_op::attention>: rows and dot_rows must not exceed max_rows and rows");

  // Score rows hold whole vectors of 16 (the row loops never take a scalar remainder).
  static constexpr index_t score_stride(index_t keys) { return vmath512::padded(keys); }
};

}  // namespace etude::backend::cpu_detail
