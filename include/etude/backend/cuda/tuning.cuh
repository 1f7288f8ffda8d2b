// Compile-time tuning of the CUDA kernels: block sizes, tiles, warps and vector widths come from
// `tuning<Op, T, Key, Arch>`, keyed by the op (a tag below), the storage type (float, etude::bf16,
// etude::fp16), an integer key (the head dimension for attention, 0 elsewhere) and the target
// architecture. The defaults suit sm_80 and sm_90 both; a user specialises to pin their own:
//
//   template <> struct etude::cuda::tuning<etude::cuda::op::attention, etude::bf16, 64,
//                                                  etude::cuda::arch::sm90>
//       : etude::cuda::tuning<etude::cuda::op::attention, etude::bf16, 64,
//                                      etude::cuda::arch::sm80> {
//     static constexpr int fwd_rows = 128;   // more rows per CTA on Hopper's larger shared memory
//   };
//
// The architecture a build tunes for is arch::target, chosen by ETUDE_CUDA_TUNING_ARCH (80 by
// default: the settings must run on every architecture the binary is built for; define it to 90
// for a Hopper-only build). Unsupported keys fail at compile time naming the supported ones;
// run-time sizes (a dim that is no multiple of the vector width) are refused by the ops with an
// etude::error before any launch.
#pragma once

#include <string>

#include "etude/backend/cuda/dtype.cuh"

#ifndef ETUDE_CUDA_TUNING_ARCH
#define ETUDE_CUDA_TUNING_ARCH 80
#endif

namespace etude::cuda {

namespace op {
struct elementwise {};   // copy with conversion, GELU, sinusoid, optimiser updates
struct reduce {};        // sum of squares, finiteness
struct layernorm {};
struct embedding {};
struct softmax_xent {};
struct attention {};
struct condition {};        // condition gathers, bias rows, row masks, fuse::sum's broadcast
struct cross_attention {};
}  // namespace op

namespace arch {
template <int CC>
struct sm {
  static constexpr int cc = CC;
};
using sm80 = sm<80>;
using sm90 = sm<90>;
using target = sm<ETUDE_CUDA_TUNING_ARCH>;
}  // namespace arch

template <class Op, class T, int Key = 0, class Arch = arch::target>
struct tuning {
  static_assert(dependent_false<Op>,
                "no CUDA tuning for this op; ops: op::elementwise, op::reduce, op::layernorm, op::embedding, "
                "op::softmax_xent, op::attention, op::condition, op::cross_attention");
};

template <class T, class Arch>
struct tuning<op::elementwise, T, 0, Arch> {
  static constexpr int threads = 256;
  static constexpr int unroll = 4;             // elements in flight per thread
  static constexpr int blocks_per_sm = 8;      // grid-stride: at most this many blocks per SM
};

template <class T, class Arch>
struct tuning<op::reduce, T, 0, Arch> {
  static constexpr int threads = 256;
  // Partials are per `chunk` elements, at most `max_blocks` of them: a function of n only, so the
  // summation order (and the bits of the result) does not depend on the device.
  static constexpr int chunk = 4096;
  static constexpr int max_blocks = 1024;
};

template <class T, class Arch>
struct tuning<op::layernorm, T, 0, Arch> {
  static constexpr int warps = 4;                        // one warp per row
  static constexpr int vec = 8;      // elements per lane access: 16 bytes of 16-bit, 32 of float
  static constexpr int bwd_rows = 32;                    // rows per block of dgamma/dbeta partials
};

template <class T, class Arch>
struct tuning<op::embedding, T, 0, Arch> {
  static constexpr int threads = 128;
  static constexpr int max_codebooks = 16;
};

template <class T, class Arch>
struct tuning<op::softmax_xent, T, 0, Arch> {
  static constexpr int threads = 256;  // one block per row of `card` logits (~2k)
};

template <class T, class Arch>
struct tuning<op::condition, T, 0, Arch> {
  static constexpr int threads = 256;  // elementwise passes, and column sums (a thread per column)
  static constexpr int blocks_per_sm = 8;
};

// The head dimensions the attention kernels are compiled for: the one list that the tuning trait
// below, the run-time dispatch (attention.cuh) and backend::cuda::accepts() read. Adding one means
// adding it here (tiles must be multiples of 16) and, if the defaults do not fit, a specialisation.
template <int... Dims>
struct head_dim_list {
  static constexpr bool contains(long long d) { return ((d == Dims) || ...); }
  static std::string names() {
    std::string s;
    ((s += (s.empty() ? "" : ", ") + std::to_string(Dims)), ...);
    return s;
  }
};
using attention_head_dims = head_dim_list<64, 128>;

// Flash attention: query rows and key rows per tile, warps per CTA. 16-bit storage runs on the
// tensor cores (WMMA 16×16×16, fp32 accumulation); float runs on FMA in exact fp32. Shared
// memory for the defaults stays under sm_80's 163 KiB opt-in limit for both head dimensions.
template <class T, int HeadDim, class Arch>
struct tuning<op::attention, T, HeadDim, Arch> {
  static_assert(attention_head_dims::contains(HeadDim),
                "no attention kernel for this head dimension; supported: etude::cuda::attention_head_dims "
                "(64, 128; add one there: tiles must be multiples of 16)");
  static constexpr bool tensor_cores = detail::is_16bit<device_t<T>>;
  static constexpr int fwd_rows = tensor_cores ? 64 : 32;
  static constexpr int fwd_cols = tensor_cores ? 64 : 32;
  static constexpr int bwd_rows = 32;
  static constexpr int bwd_cols = tensor_cores ? 64 : 32;
  static constexpr int warps = 4;
};

// Cross-attention (cross_attention.cuh): keys in chunks of 32 (a warp's lanes), one warp per query
// row. Forward and the queries' backward: `warps` warps of `rows_per_warp` rows per CTA; the keys'
// backward: a CTA of `key_threads` threads per 32 keys walks the query rows in tiles of
// `key_query_rows`, in order (deterministic). Any head dimension the self-attention takes.
template <class T, int HeadDim, class Arch>
struct tuning<op::cross_attention, T, HeadDim, Arch> {
  static_assert(attention_head_dims::contains(HeadDim),
                "no cross-attention kernel for this head dimension; supported: etude::cuda::attention_head_dims");
  static constexpr int warps = 4;
  static constexpr int rows_per_warp = 4;
  static constexpr int key_threads = 256;
  static constexpr int key_query_rows = 32;
};

}  // namespace etude::cuda
