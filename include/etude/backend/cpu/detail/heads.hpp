// What the CPU's attention ops share (attention.hpp, cross_attention.hpp): the per-thread scratch
// slots and one head's rows widened into the compute type and rounded back.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>

#include "etude/backend/cpu/detail/bf16_pairs.hpp"
#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/vmath512.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/error.hpp"
#include "etude/core/types.hpp"

namespace etude::backend::cpu_detail {

// Threads the scratch has room for (one slot each, at most the thread count); refuses a scratch
// below one slot.
inline int slot_count(const char* op, index_t slot, index_t scratch_size) {
  if (scratch_size < slot)
    throw error(std::string(op) + ": scratch of " + std::to_string(scratch_size) + " values is below one slot (" +
                std::to_string(slot) + ")");
  return static_cast<int>(std::max<index_t>(1, std::min<index_t>(threads(), scratch_size / slot)));
}

// rows of one head (head_dim values at stride ld) into a dense (rows, head_dim) block, and back.
template <class F, class T>
inline void widen_head(F* dst, const T* src, index_t ld, index_t rows, index_t head_dim) {
  for (index_t s = 0; s < rows; ++s)
#pragma omp simd
    for (index_t j = 0; j < head_dim; ++j) dst[s * head_dim + j] = cv<F>(src[s * ld + j]);
}
#ifdef ETUDE_BF16_PAIRS
// narrow_head's bf16 rows from floats two vectors at a time (bf16_pairs::kernel::round_two, bf16(float)'s bits):
// at T = 256 the attention heads' rounding was 3% of tiny's bf16 attention as a loop of elements.
ETUDE_BF16_PAIRS_TARGET inline __m512 scaled_lanes(const float* f, __mmask16 m, const float* row_scale, __m512 scale) {
  const __m512 x = _mm512_maskz_loadu_ps(m, f);
  return row_scale != nullptr ? _mm512_mul_ps(x, scale) : x;
}
ETUDE_BF16_PAIRS_TARGET inline void narrow_rows_bf16(bf16* dst, index_t ld, const float* src, index_t rows,
                                                     index_t cols, const float* row_scale) {
  using bf16_pairs::lanes;
  constexpr __mmask16 all = 0xFFFF;
  for (index_t s = 0; s < rows; ++s) {
    const float* f = src + s * cols;
    bf16* o = dst + s * ld;
    const __m512 scale = _mm512_set1_ps(row_scale != nullptr ? row_scale[s] : 1.0f);
    index_t j = 0;
    for (; j + 2 * lanes <= cols; j += 2 * lanes)
      _mm512_storeu_si512(o + j, bf16_pairs::kernel::round_two(scaled_lanes(f + j, all, row_scale, scale),
                                                               scaled_lanes(f + j + lanes, all, row_scale, scale)));
    for (; j < cols; j += lanes) {
      const __mmask16 m = vmath512::valid(j, cols);
      _mm256_mask_storeu_epi16(o + j, m, vmath512::round_to_bf16(scaled_lanes(f + j, m, row_scale, scale)));
    }
  }
}
#endif
// (narrow_head: each row times row_scale[s] first where given, the forward's 1/Σ of its row.)
template <class T, class F>
inline void narrow_head(T* dst, index_t ld, const F* src, index_t rows, index_t head_dim,
                        const F* row_scale = nullptr) {
#ifdef ETUDE_BF16_PAIRS
  if constexpr (std::is_same_v<T, bf16> && std::is_same_v<F, float>) {
    if (bf16_pairs::available()) {
      narrow_rows_bf16(dst, ld, src, rows, head_dim, row_scale);
      return;
    }
  }
#endif
  for (index_t s = 0; s < rows; ++s) {
    const F scale = row_scale != nullptr ? row_scale[s] : F(1);
    if (row_scale != nullptr) {
#pragma omp simd
      for (index_t j = 0; j < head_dim; ++j) dst[s * ld + j] = cv<T>(src[s * head_dim + j] * scale);
    } else {
#pragma omp simd
      for (index_t j = 0; j < head_dim; ++j) dst[s * ld + j] = cv<T>(src[s * head_dim + j]);
    }
  }
}

}  // namespace etude::backend::cpu_detail
