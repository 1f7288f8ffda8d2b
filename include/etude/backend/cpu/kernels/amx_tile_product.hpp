// tile_product's bf16 pair products on AMX tiles, where the CPU has them and the kernel grants
// their state (isa::amx_bf16()): the same contract as the AVX512_BF16 kernels (operands in pair
// words, alpha, beta, a causal operand's shape), the instruction tdpbf16ps instead of vdpbf16ps.
// Included by avx512_tile_product.hpp, whose product() sends word products here.
//
// A tile is 16 rows of 16 words (64 bytes); B's pair layout is the tile's own (a row of B is a word
// of the reduction, 16 columns across), so B is read in place, and so is a row-major A whose
// reduction fills whole tiles. Other A (seen transposed, or a reduction that ends inside a tile) is
// staged, zero-padded, in a thread's own buffer once per call; a reduction's last partial tile of B
// is staged with zero rows. C is built in blocks of 2 × 2 tiles (32 × 32 outputs; tiles 0–3
// accumulate, 4–5 hold A, 6–7 B) over the reduction in steps of 16 words counted from word 0 (in
// chunks of steps, amx_product below), so
// each output's sum is grouped by the reduction alone: the same bits whatever the rows, columns or
// strides of a call, and the same bits when a causal shape leaves out steps of zeros. The sums are
// not vdpbf16ps's bits (the instruction groups 16 pairs a step, and flushes subnormal inputs and
// outputs as vdpbf16ps does); they are float roundings of the same products.
//
// Tile state is per thread: each call loads its configuration and releases the tiles at its end,
// so a call may run on any thread, beside oneDNN's own tile kernels.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "etude/backend/cpu/kernels/avx512_tile_product.hpp"
#include "etude/backend/cpu/kernels/isa.hpp"
#include "etude/core/buffer.hpp"

namespace etude::backend::cpu_detail::tile_product {

// Whether word products run on AMX tiles in this process: the CPU has them, the kernel granted
// them, and neither ETUDE_AMX=off nor set_amx_tiles(false) said no (for measuring and testing the
// AVX512_BF16 kernels on the same CPU).
inline std::atomic<bool>& amx_enabled() {
  static std::atomic<bool> on = [] {
    const char* env = std::getenv("ETUDE_AMX");
    return env == nullptr || (std::strcmp(env, "off") != 0 && std::strcmp(env, "0") != 0);
  }();
  return on;
}
inline bool amx_tiles() { return isa::amx_bf16() && amx_enabled().load(); }
inline void set_amx_tiles(bool on) { amx_enabled().store(on); }

#ifdef ETUDE_CPU_X86_KERNELS

namespace amx {

inline constexpr index_t edge = 16;  // a tile's rows, and words in a row (64 bytes)
static_assert(amx_words(1) == edge, "tile_product::amx_words rounds to whole tiles");

// The instructions, with the tile's number an immediate. Each names memory it reads or writes to
// the compiler ("memory"): a staged buffer is written by ordinary stores just before a tile load.
template <int T>
inline void load_tile(const void* at, index_t stride_bytes) {
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(at), "r"(static_cast<long>(stride_bytes)), "i"(T)
                   : "memory");
}
template <int T>
inline void store_tile(void* at, index_t stride_bytes) {
  __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(at), "r"(static_cast<long>(stride_bytes)), "i"(T)
                   : "memory");
}
template <int T>
inline void zero_tile() {
  __asm__ volatile("tilezero %%tmm%c0" ::"i"(T));
}
// tile C += A·B, in pairs (tdpbf16ps)
template <int C, int A, int B>
inline void dot_tiles() {
  __asm__ volatile("tdpbf16ps %%tmm%c0, %%tmm%c1, %%tmm%c2" ::"i"(B), "i"(A), "i"(C));
}

// Palette 1, eight tiles of 16 rows × 64 bytes.
struct alignas(64) tile_config {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
static_assert(sizeof(tile_config) == 64, "amx::tile_config: ldtilecfg reads 64 bytes");

// The calling thread's tiles configured while it lives, released after.
class tiles {
 public:
  tiles() {
    static const tile_config config{};
    __asm__ volatile("ldtilecfg %0" ::"m"(config));
  }
  ~tiles() { __asm__ volatile("tilerelease" ::); }
  tiles(const tiles&) = delete;
  tiles& operator=(const tiles&) = delete;
};

// Buffers of the calling thread's own, at least `count` long (grown, never shrunk), on a 64-byte
// line (etude::buffer): staged A, and the sums of a block's columns between chunks of the reduction.
template <class T, int Which>
inline T* thread_room(index_t count) {
  thread_local buffer<T> room;
  if (room.size() < count) room.resize(count);
  return room.data();
}
inline word* stage_room(index_t words) { return thread_room<word, 0>(words); }
inline float* partial_room(index_t floats) { return thread_room<float, 1>(floats); }

// Steps of the reduction (16 words each) in a chunk (amx_product): a 32-row block of A's chunk is
// 16 KiB, a 64-column panel's B 32 KiB. On one core of a 2-core AMX Xeon, 64-aligned operands
// (GFLOP/s of product() called over and over by a scratch driver, not kept; rows × columns × words;
// `build/bench/cpu_kernels --kernel gemm_bf16_amx` times whole products): 96 × 64 × 1024 1,590 in chunks of 8,
// 1,462 of 4, 1,454 unchunked; 192 × 64 × 1024 1,603, 1,345, 1,477; 96 × 64 × 256 1,526, 1,518, 1,307.
inline constexpr index_t chunk_steps = 8;

// A's words [w0, w1) of rows [i, i + rows) into dst as `out_rows` rows (a multiple of the tile, at
// least rows) of `ld` words (ld ≥ w1 − w0, a multiple of the tile), zero past w1 − w0 and past rows:
// the layout tiles load in place. A seen transposed (a_row = 1: a tile's 16 rows lie together in
// each word) goes in 16 × 16 words transposed in registers.
ETUDE_CPU_AVX512_BF16_TARGET inline void rows_of_words(word* dst, index_t ld, index_t out_rows, const word* a,
                                                       index_t a_row, index_t a_pair, index_t i, index_t rows,
                                                       index_t w0, index_t w1) {
  const index_t count = w1 - w0;
  if (a_row == 1) {
    for (index_t r0 = 0; r0 < out_rows; r0 += edge) {
      const __mmask16 m = r0 < rows ? vmath512::valid(r0, rows) : __mmask16(0);
      for (index_t p0 = 0; p0 < ld; p0 += edge) {
        __m512i x[16];
#pragma GCC unroll 16
        for (int q = 0; q < 16; ++q)
          x[q] = p0 + q < count ? _mm512_maskz_loadu_epi32(m, a + (i + r0) + (w0 + p0 + q) * a_pair)
                                : _mm512_setzero_si512();
        kernel::transpose_16x16(x);
#pragma GCC unroll 16
        for (int r = 0; r < 16; ++r) _mm512_storeu_si512(dst + (r0 + r) * ld + p0, x[r]);
      }
    }
    return;
  }
  for (index_t r = 0; r < out_rows; ++r) {
    word* d = dst + r * ld;
    if (r >= rows) {
      std::fill(d, d + ld, word(0));
      continue;
    }
    const word* s = a + (i + r) * a_row + w0 * a_pair;
    if (a_pair == 1) {
      std::memcpy(d, s, static_cast<std::size_t>(count) * sizeof(word));
    } else {
      for (index_t p = 0; p < count; ++p) d[p] = s[p * a_pair];
    }
    std::fill(d + count, d + ld, word(0));
  }
}

// One tile of outputs from the float tile `t` (16 × 16, rows 64 bytes apart) into C: `rows` rows,
// the columns `cols` masks, as alpha·t + beta·C.
template <class TC>
ETUDE_CPU_AVX512_BF16_TARGET inline void finish(const float* t, index_t rows, __mmask16 cols, float alpha, float beta,
                                                TC* c, index_t ldc) {
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (index_t r = 0; r < rows; ++r) kernel::store(c + r * ldc, cols, _mm512_load_ps(t + r * edge), va, beta, vb);
}

}  // namespace amx

namespace kernel {

// One block of 32 rows of A: its rows, the steps of the reduction they meet, and where its words
// are read (in place, or staged).
struct row_block {
  index_t i, rows, s0, s1;
  const word* a;
  index_t ld;
};

// product() on AMX tiles (above): requires amx_tiles(). The reduction goes in chunks of
// chunk_steps; within a chunk every block of rows meets every block of columns, so the chunk's B
// (32 KiB for 64 columns) stays near across the row blocks and a row block's A (16 KiB) across the
// column blocks. Sums wait in `partial` between chunks (tile stores and loads are exact: the same
// bits as one pass).
template <class TC>
ETUDE_CPU_AVX512_BF16_TARGET inline void amx_product(index_t m, index_t n, index_t words, float alpha, const word* a,
                                                     index_t a_row, index_t a_pair, const word* b, index_t ldb,
                                                     float beta, TC* c, index_t ldc, causal shape) {
  using namespace amx;
  constexpr index_t block = 2 * edge, per = 2;  // rows or columns of a block; bf16 in a word
  constexpr index_t tile_floats = edge * edge, out_stride = edge * index_t(sizeof(float));
  const amx::tiles held;
  alignas(64) word b_last[2 * edge * edge];  // a reduction's partial last tile of B, two columns of tiles
  alignas(64) float out[tile_floats];
  const index_t whole_steps = words / edge;
  const index_t row_blocks = (m + block - 1) / block, column_blocks = (n + block - 1) / block;
  // A row-major A whose reduction fills whole tiles is read in place; other A is staged, each
  // block's steps zero-padded to whole tiles
  const bool a_in_place = a_pair == 1 && words % edge == 0;
  thread_local std::vector<row_block> blocks;
  blocks.clear();
  index_t staged_words = 0, first_step = whole_steps + 1, end_step = 0;
  for (index_t i = 0; i < m; i += block) {
    const index_t rows = std::min(block, m - i);
    // the reduction's steps the block's rows meet: the union of theirs, counted from word 0
    const index_t s0 = shape.first_word(i, per) / edge;
    const index_t s1 = std::max(s0, (shape.end_word(i, rows, words, per) + edge - 1) / edge);
    const bool staged = s1 > s0 && (!a_in_place || rows < block);
    blocks.push_back({i, rows, s0, s1, a + i * a_row + s0 * edge, staged ? (s1 - s0) * edge : a_row});
    if (staged) staged_words += block * (s1 - s0) * edge;
    first_step = std::min(first_step, s0);
    end_step = std::max(end_step, s1);
  }
  if (staged_words > 0) {
    word* room = stage_room(staged_words);
    for (row_block& rb : blocks) {
      if (rb.s1 == rb.s0 || (a_in_place && rb.rows == block)) continue;
      rows_of_words(room, rb.ld, block, a, a_row, a_pair, rb.i, rb.rows, rb.s0 * edge, std::min(words, rb.s1 * edge));
      rb.a = room;
      room += block * rb.ld;
    }
  }
  const bool chunked = end_step - first_step > chunk_steps;
  float* partial = chunked ? partial_room(row_blocks * column_blocks * 4 * tile_floats) : nullptr;
  const bool cut = shape.what == causal::columns_to_row;
  for (index_t k0 = std::min(first_step, end_step);; k0 += chunk_steps) {
    const index_t k1 = std::min(end_step, k0 + chunk_steps);
    for (index_t ib = 0; ib < row_blocks; ++ib) {
      const row_block& rb = blocks[static_cast<std::size_t>(ib)];
      // the block's steps in this chunk; a block that meets none is written (beta·C) with the first
      const index_t lo = std::max(k0, rb.s0), hi = std::min(k1, rb.s1);
      const bool empty = rb.s0 == rb.s1;
      if (empty ? (k0 != std::min(first_step, end_step) || beta == 1.0f) : lo >= hi) continue;
      const bool first = empty || lo == rb.s0, last = empty || hi == rb.s1;
      const index_t i = rb.i, rows = rb.rows, a_ld = rb.ld;
      // the last row of each row tile, for a causal shape's columns
      const index_t last0 = i + std::min(edge, rows) - 1, last1 = i + rows - 1;
      const bool two_rows = rows > edge;
      const index_t r0 = std::min(edge, rows), r1 = rows - r0;
      for (index_t jb = 0; jb < column_blocks; ++jb) {
        const index_t j = jb * block;
        const bool two_cols = n - j > edge;
        // the tiles this block writes: all, or those with a column at or before their rows' diagonal
        const bool t00 = !cut || j <= shape.offset + last0;
        const bool t01 = two_cols && (!cut || j + edge <= shape.offset + last0);
        const bool t10 = two_rows && (!cut || j <= shape.offset + last1);
        const bool t11 = two_rows && two_cols && (!cut || j + edge <= shape.offset + last1);
        if (!t00 && !t10) break;  // past every row's diagonal, and so is every later block
        float* sums = chunked ? partial + (ib * column_blocks + jb) * 4 * tile_floats : nullptr;
        if (first) {
          zero_tile<0>();
          zero_tile<1>();
          zero_tile<2>();
          zero_tile<3>();
        } else {
          load_tile<0>(sums, out_stride);
          load_tile<1>(sums + tile_floats, out_stride);
          load_tile<2>(sums + 2 * tile_floats, out_stride);
          load_tile<3>(sums + 3 * tile_floats, out_stride);
        }
        for (index_t s = lo; s < hi; ++s) {
          const word* as = rb.a + (s - rb.s0) * edge;
          load_tile<4>(as, a_ld * index_t(sizeof(word)));
          if (two_rows) load_tile<5>(as + edge * a_ld, a_ld * index_t(sizeof(word)));
          if (s < whole_steps) {
            const word* bs = b + s * edge * ldb + j;
            load_tile<6>(bs, ldb * index_t(sizeof(word)));
            if (two_cols) load_tile<7>(bs + edge, ldb * index_t(sizeof(word)));
          } else {
            // rows of B past the reduction are not there to read: zeros meet A's zero words
            const index_t have = words - s * edge, width = two_cols ? block : edge;
            for (index_t p = 0; p < edge; ++p) {
              word* d = b_last + p * block;
              if (p < have)
                std::memcpy(d, b + (s * edge + p) * ldb + j, static_cast<std::size_t>(width) * sizeof(word));
              else
                std::fill(d, d + width, word(0));
            }
            load_tile<6>(b_last, block * index_t(sizeof(word)));
            if (two_cols) load_tile<7>(b_last + edge, block * index_t(sizeof(word)));
          }
          if (t00) dot_tiles<0, 4, 6>();
          if (t01) dot_tiles<1, 4, 7>();
          if (t10) dot_tiles<2, 5, 6>();
          if (t11) dot_tiles<3, 5, 7>();
        }
        if (!last) {
          store_tile<0>(sums, out_stride);
          store_tile<1>(sums + tile_floats, out_stride);
          store_tile<2>(sums + 2 * tile_floats, out_stride);
          store_tile<3>(sums + 3 * tile_floats, out_stride);
          continue;
        }
        const __mmask16 c0 = vmath512::valid(j, n), c1 = two_cols ? vmath512::valid(j + edge, n) : __mmask16(0);
        TC* cb = c + i * ldc + j;
        if constexpr (std::is_same_v<TC, float>) {
          // whole float tiles with nothing to scale or add go straight to C
          if (alpha == 1.0f && beta == 0.0f && r0 == edge && c0 == __mmask16(0xFFFF) &&
              (!two_cols || c1 == __mmask16(0xFFFF)) && (!two_rows || r1 == edge)) {
            const index_t stride = ldc * index_t(sizeof(float));
            if (t00) store_tile<0>(cb, stride);
            if (t01) store_tile<1>(cb + edge, stride);
            if (t10) store_tile<2>(cb + edge * ldc, stride);
            if (t11) store_tile<3>(cb + edge * ldc + edge, stride);
            continue;
          }
        }
        if (t00) {
          store_tile<0>(out, out_stride);
          finish(out, r0, c0, alpha, beta, cb, ldc);
        }
        if (t01) {
          store_tile<1>(out, out_stride);
          finish(out, r0, c1, alpha, beta, cb + edge, ldc);
        }
        if (t10) {
          store_tile<2>(out, out_stride);
          finish(out, r1, c0, alpha, beta, cb + edge * ldc, ldc);
        }
        if (t11) {
          store_tile<3>(out, out_stride);
          finish(out, r1, c1, alpha, beta, cb + edge * ldc + edge, ldc);
        }
      }
    }
    if (k1 >= end_step) break;
  }
}

}  // namespace kernel

template <class TC>
void amx_product(index_t m, index_t n, index_t words, float alpha, const word* a, index_t a_row, index_t a_pair,
                 const word* b, index_t ldb, float beta, TC* c, index_t ldc, causal shape) {
  kernel::amx_product(m, n, words, alpha, a, a_row, a_pair, b, ldb, beta, c, ldc, shape);
}

#endif

}  // namespace etude::backend::cpu_detail::tile_product
