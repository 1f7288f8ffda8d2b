// Compile-time tuning of the CPU backend: tile and block sizes, scratch rows and the size below
// which a loop stays on one thread come from `cpu_tuning<Op, T, Key, Isa>`, shaped like the CUDA
// backend's `cuda::tuning<Op, T, Key, Arch>` (backend/cuda/tuning.cuh): keyed by the op (a tag
// below), a storage type (void where one value serves every type), an integer key (0: the CPU's
// loops take any head dimension) and the instruction set of the path that reads it (cpu_isa below:
// the portable loops, or a kernel of backend/cpu/kernels/). A user specialises the form an op reads
// to pin their own, before including the backend:
//
//   template <> struct etude::backend::cpu_tuning<etude::backend::cpu_op::gemm, etude::bf16, 0,
//                                                 etude::backend::cpu_isa::avx512_bf16>
//       : etude::backend::cpu_tuning<etude::backend::cpu_op::gemm, etude::bf16, 0,
//                                    etude::backend::cpu_isa::avx512_bf16, true> {
//     static constexpr index_t block_rows = 120;  // 20 tiles of 6 rows per thread's block
//   };
//
// (the last argument, `true`, names the defaults themselves, so that a specialisation can inherit
// them). The defaults are the values the backend was measured with (docs/cpu-kernels.md). Not the
// place for constants a kernel's registers fix (tile_product's 6 × 64 tile) or that decide bits
// (cpu_reduce's sum_squares_block, which shards of a sharded optimiser start on).
#pragma once

#include "etude/core/dtype.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

namespace cpu_op {
struct loops {};            // every op's loops over independent rows or elements
struct gemm {};             // matrix products (gemm.hpp, kernels/avx512_bf16_gemm.hpp)
struct attention {};        // causal self-attention (attention.hpp)
struct cross_attention {};  // cross-attention (cross_attention.hpp)
}  // namespace cpu_op

namespace cpu_isa {
struct portable {};     // the portable loops and CBLAS (every CPU)
struct avx512_bf16 {};  // etude's AVX512_BF16 tile kernels (kernels/avx512_tile_product.hpp)
}  // namespace cpu_isa

// Defaults = true: the library's values, for a user's specialisation to inherit.
template <class Op, class T = void, int Key = 0, class Isa = cpu_isa::portable, bool Defaults = false>
struct cpu_tuning : cpu_tuning<Op, T, Key, Isa, true> {};

template <class Op, class T, int Key, class Isa>
struct cpu_tuning<Op, T, Key, Isa, true> {
  static_assert(detail::dependent_false<Op>,
                "no CPU tuning for this op and instruction set; read as: cpu_tuning<cpu_op::loops>, "
                "cpu_tuning<cpu_op::gemm>, cpu_tuning<cpu_op::gemm, bf16, 0, cpu_isa::avx512_bf16>, "
                "cpu_tuning<cpu_op::attention>, cpu_tuning<cpu_op::cross_attention>");
};

// Elements below which a loop of independent rows or elements runs on one thread: opening an
// OpenMP region costs microseconds, and on a busy machine a passive thread waits a scheduler slice,
// which a generation step's one-row ops pay hundreds of times. The work itself (and so every result)
// is the same on any thread count.
// Zeroing `stream_bytes` or more (a step's gradients) uses streaming stores, which skip reading
// each line before writing it: past that size the step's other buffers have pushed the run out of
// every cache by the time it is cleared again. On a 2-core AMX Xeon (L3 reported as 480 MiB; one
// `build/bench/step_bench small|tiny --precision bf16 --profile` each, 2 rounds) small's 136 MB of
// gradients cleared in 3.2–5.9 ms streamed against 6.4–7.1 cached; tiny's 30 MB, which stays
// cached, in 1.0 ms cached against 1.2 streamed.
template <>
struct cpu_tuning<cpu_op::loops, void, 0, cpu_isa::portable, true> {
  static constexpr index_t parallel_min = 16384;
  static constexpr index_t stream_bytes = index_t(64) << 20;
};

// Products with a 16-bit operand that take no bf16 dot products: (tile)³ blocks widened to float
// and multiplied by sgemm; three tiles of workspace (3 MiB at 512: fewer, larger sgemm calls).
// A block of `widen_parallel_min` elements or fewer is widened on one thread.
template <>
struct cpu_tuning<cpu_op::gemm, void, 0, cpu_isa::portable, true> {
  static constexpr index_t tile = 512;
  static constexpr index_t workspace_floats = 3 * tile * tile;
  static constexpr index_t widen_parallel_min = 16384;
};

// etude's AVX512_BF16 products (kernels/avx512_bf16_gemm.hpp): `block_rows` rows of A a thread
// takes at a time (16 tiles of 6); the panel-by-panel schedule, which streams all of op(A) once per
// panel, while op(A) is at most `panelwise_a_bytes` (it stays in cache).
template <>
struct cpu_tuning<cpu_op::gemm, bf16, 0, cpu_isa::avx512_bf16, true> {
  static constexpr index_t block_rows = 96;
  static constexpr index_t panelwise_a_bytes = index_t{4} << 20;
};

// Self-attention's blocks of query rows: `rows`, or `max_rows` for sequences longer than
// `long_steps` (the products are most of the time, and taller blocks run them faster once a row's
// keys outnumber the masked corner a tall diagonal block wastes); etude's AVX-512 kernels take
// `dot_rows` at every length (a 128-row block's scores and dP, 1 MiB each at T = 2048, outgrow L2).
// The scratch is sized for attention_rows(steps), so dot_rows ≤ rows ≤ max_rows. Forward and
// backward ms a step at T = 2048, head dim 64, 2 threads (a 2-core AVX512_BF16 CPU, model not recorded;
// `build/bench/step_bench tiny_long --profile`, with --precision bf16, the block sizes changed here):
// fp32 on oneDNN 52–57 and 133–139 with 128 rows, 54–56 and 153–155 with 64; bf16 on oneDNN's dot
// products 48 and 86 with 128, 54 and 101 with 64; bf16 on etude's kernels 29.2–29.5 and
// 66.1–67.7 with 64 rows, 30.4–31.2 and 69.2–69.6 with 128.
template <>
struct cpu_tuning<cpu_op::attention, void, 0, cpu_isa::portable, true> {
  static constexpr index_t rows = 64;
  static constexpr index_t max_rows = 128;
  static constexpr index_t long_steps = 512;
};
template <>
struct cpu_tuning<cpu_op::attention, void, 0, cpu_isa::avx512_bf16, true> {
  static constexpr index_t dot_rows = 64;
};

// Cross-attention's blocks of query rows (each against every position).
template <>
struct cpu_tuning<cpu_op::cross_attention, void, 0, cpu_isa::portable, true> {
  static constexpr index_t rows = 64;
};

}  // namespace etude::backend
