// GELU of 16-bit activations by table (cpu_elementwise::gelu_fwd and gelu_bwd): a bf16 or fp16
// input has 65536 values, so its GELU (rounded to its type) and its slope (a float) are tables
// indexed by its bits, made once from the element functions. The lookups below take 16 inputs
// per gather on AVX-512.
//
// Computing exact-erf GELU costs about 65 vector instructions per 16 values; a gather costs about
// 16 cycles. The forward looks up 8M bf16 values in 1.9 ms on 2 threads (a 2-core AVX512_BF16 CPU, model not recorded:
// `build/bench/cpu_kernels --kernel gelu_bf16_avx512 --rows 8192 --keys 1024 --threads 2`, against
// `--kernel gelu_bf16_table`), the same bits as computing them.
#pragma once

#include <cstdint>
#include <type_traits>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/kernels/avx512_vmath.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/types.hpp"

namespace etude::backend::cpu_detail::gelu_lookup {

#ifdef ETUDE_CPU_X86_KERNELS

using vmath512::lanes;

// out[i] = table[in[i]] for the (up to 16) lanes of m: 16-bit codes, the table one entry longer
// than the codes it indexes (a 32-bit gather at the last code reads it).
ETUDE_CPU_AVX512_TARGET inline void codes16(std::uint16_t* out, const std::uint16_t* in, const std::uint16_t* table,
                                            __mmask16 m) {
  const __m512i code = _mm512_maskz_cvtepu16_epi32(m, _mm256_maskz_loadu_epi16(m, in));
  const __m512i got = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, code, table, 2);
  _mm256_mask_storeu_epi16(out, m, _mm512_maskz_cvtepi32_epi16(vmath512::all, got));
}

// out[i] = table[in[i]] for i < n: on the team for a long run, on the calling thread otherwise.
ETUDE_CPU_AVX512_TARGET inline void codes(std::uint16_t* out, const std::uint16_t* in, const std::uint16_t* table,
                                          index_t n) {
#pragma omp parallel for schedule(static) if (n > parallel_min)
  for (index_t i = 0; i < n; i += lanes) codes16(out + i, in + i, table, vmath512::valid(i, n));
}

// dy[i] = dy[i]·slope[in[i]] for the lanes of m, rounded once to dy's type (bf16 as bf16(float)
// rounds, or float).
template <class DY>
ETUDE_CPU_AVX512_TARGET inline void scale16(DY* dy, const std::uint16_t* in, const float* slope, __mmask16 m) {
  const __m512i code = _mm512_maskz_cvtepu16_epi32(m, _mm256_maskz_loadu_epi16(m, in));
  const __m512 s = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, code, slope, 4);
  const __m512 x = _mm512_mul_ps(vmath512::load(dy, m), s);
  if constexpr (std::is_same_v<DY, float>)
    _mm512_mask_storeu_ps(dy, m, x);
  else
    _mm256_mask_storeu_epi16(dy, m, vmath512::round_to_bf16(x));
}

// dy[i] = dy[i]·slope[in[i]] for i < n: on the team for a long run, on the calling thread otherwise.
template <class DY>
ETUDE_CPU_AVX512_TARGET inline void scale(DY* dy, const std::uint16_t* in, const float* slope, index_t n) {
#pragma omp parallel for schedule(static) if (n > parallel_min)
  for (index_t i = 0; i < n; i += lanes) scale16(dy + i, in + i, slope, vmath512::valid(i, n));
}

// The same lookups as epilogues of a matrix product (tile_product::gemm's post): each block of C,
// just computed and still in the core's cache, is passed over once on the thread that made it.
// The blocks are of a matrix laid out as `base` with the block's leading dimension, and `twin` is
// the matrix of the same layout the lookup pairs with it.
//   block_gelu       C is the pre-activation: twin (the activation) = GELU(C) by the codes' table
//   block_gelu_slope C is dy: C = C·GELU'(twin), twin the pre-activation, by the slopes' table
// Either is the same bits as its lookup over the whole matrix after the product.
struct block_gelu {
  const bf16* base;
  bf16* twin;
  const std::uint16_t* table;
  ETUDE_CPU_AVX512_TARGET void operator()(bf16* c, index_t ldc, index_t rows, index_t cols) const {
    const index_t at = c - base;
    for (index_t r = 0; r < rows; ++r) {
      const auto* in = reinterpret_cast<const std::uint16_t*>(c + r * ldc);
      auto* out = reinterpret_cast<std::uint16_t*>(twin + at + r * ldc);
      for (index_t j = 0; j < cols; j += lanes) codes16(out + j, in + j, table, vmath512::valid(j, cols));
    }
  }
};
struct block_gelu_slope {
  const bf16* base;
  const bf16* twin;
  const float* slope;
  ETUDE_CPU_AVX512_TARGET void operator()(bf16* c, index_t ldc, index_t rows, index_t cols) const {
    const index_t at = c - base;
    for (index_t r = 0; r < rows; ++r) {
      const auto* in = reinterpret_cast<const std::uint16_t*>(twin + at + r * ldc);
      for (index_t j = 0; j < cols; j += lanes) scale16(c + r * ldc + j, in + j, slope, vmath512::valid(j, cols));
    }
  }
};

#endif

}  // namespace etude::backend::cpu_detail::gelu_lookup
