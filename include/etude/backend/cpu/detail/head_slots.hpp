// What the CPU's attention ops share (attention.hpp, cross_attention.hpp): the per-thread scratch
// slots and one head's rows widened into the compute type and rounded back.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/kernels/avx512_tile_product.hpp"
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
template <class Compute, class T>
inline void widen_head(Compute* dst, const T* src, index_t ld, index_t rows, index_t head_dim) {
  for (index_t s = 0; s < rows; ++s)
#pragma omp simd
    for (index_t j = 0; j < head_dim; ++j) dst[s * head_dim + j] = convert<Compute>(src[s * ld + j]);
}
// Each row times row_scale[s] first where given (the forward's 1/Σ of its row); bf16 from float
// two vectors at a time where the CPU has AVX512_BF16 (tile_product::kernel::round_row).
template <class T, class Compute>
inline void narrow_head(T* dst, index_t ld, const Compute* src, index_t rows, index_t head_dim,
                        const Compute* row_scale = nullptr) {
  for (index_t s = 0; s < rows; ++s) {
    const Compute scale = row_scale != nullptr ? row_scale[s] : Compute(1);
#ifdef ETUDE_CPU_X86_KERNELS
    if constexpr (std::is_same_v<T, bf16> && std::is_same_v<Compute, float>) {
      if (tile_product::available()) {
        tile_product::kernel::round_row(dst + s * ld, src + s * head_dim, head_dim, scale);
        continue;
      }
    }
#endif
#pragma omp simd
    for (index_t j = 0; j < head_dim; ++j) dst[s * ld + j] = convert<T>(src[s * head_dim + j] * scale);
  }
}

}  // namespace etude::backend::cpu_detail
