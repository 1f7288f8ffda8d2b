// Codebook embeddings on the current stream.
//   embedding_fwd: x(b, s, :) = Σ_k table_k(seq(b, k, s), :) + pos(s, :), summed in codebook order
//     in float and rounded once; a block per row.
//   embedding_bwd: dtable_k(tok, :) += Σ over the rows r with seq(b, k, s) = tok of dx(r, :).
//     Deterministic without atomics, sort-based: per codebook the (token, row) pairs are sorted by
//     token with CUB's stable radix sort, so each token's rows stay in increasing order; the block
//     at the start of a token's run owns that table row and adds the dx rows in that order (the
//     CPU backend's order: in float the results are bit-identical to it).
// Negative tokens (never produced by a pattern) are skipped. Not for: tied input/output weights.
#pragma once

#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include <string>

#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"

namespace etude::cuda {

namespace detail {

template <class D, int MaxK>
struct table_ptrs {
  const D* p[MaxK];
};
template <class D, int MaxK>
struct dtable_ptrs {
  D* p[MaxK];
};

template <class X, class W, class P, int MaxK>
__global__ void embedding_fwd_kernel(X* x, const token_t* seq, table_ptrs<W, MaxK> tables, const P* pos,
                                     index_t steps, int codebooks, index_t dim) {
  const index_t r = blockIdx.x, b = r / steps, s = r % steps;
  for (index_t j = threadIdx.x; j < dim; j += blockDim.x) {
    float acc = to_float(tables.p[0][static_cast<index_t>(seq[b * codebooks * steps + s]) * dim + j]);
    for (int k = 1; k < codebooks; ++k)
      acc += to_float(tables.p[k][static_cast<index_t>(seq[(b * codebooks + k) * steps + s]) * dim + j]);
    acc += to_float(pos[s * dim + j]);
    x[r * dim + j] = from_float<X>(acc);
  }
}

// keys(r) = seq(b, k, s) as unsigned (negative tokens sort last), rows(r) = r. A template so that
// every translation unit including this header may define it.
template <class Tok>
__global__ void embedding_gather_keys(unsigned* keys, int* rows_out, const Tok* seq, index_t steps,
                                             int codebooks, int k, index_t rows) {
  for (index_t r = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t b = r / steps, s = r % steps;
    keys[r] = static_cast<unsigned>(seq[(b * codebooks + k) * steps + s]);
    rows_out[r] = static_cast<int>(r);
  }
}

// Block i: if sorted position i starts a run of one token, table row += the run's dx rows in order.
template <class G, class D>
__global__ void embedding_accumulate(G* table, const D* dx, const unsigned* keys, const int* rows_sorted,
                                     index_t rows, index_t dim) {
  const index_t i = blockIdx.x;
  const unsigned tok = keys[i];
  if ((i > 0 && keys[i - 1] == tok) || static_cast<token_t>(tok) < 0) return;
  index_t end = i + 1;
  while (end < rows && keys[end] == tok) ++end;
  G* out = table + static_cast<index_t>(tok) * dim;
  for (index_t j = threadIdx.x; j < dim; j += blockDim.x) {
    // rounded after every add, as the CPU backend does when G is 16-bit (exact for float)
    float acc = to_float(out[j]);
    for (index_t p = i; p < end; ++p)
      acc = to_float(from_float<G>(acc + to_float(dx[static_cast<index_t>(rows_sorted[p]) * dim + j])));
    out[j] = from_float<G>(acc);
  }
}

}  // namespace detail

// The embedding ops (ops/embedding.hpp); backend::cuda inherits them.
struct cuda_embedding {
  // tables: a host array of `codebooks` device pointers, each (C+1, dim); seq (B, K, S) device.
  template <class X, class W, class P>
  static void embedding_fwd(X* x, const token_t* seq, const W* const* tables, const P* pos, index_t batch,
                            int codebooks, index_t steps, index_t dim) {
    using tune = tuning<op::embedding, X>;
    detail::require(codebooks >= 1 && codebooks <= tune::max_codebooks, "embedding_fwd",
                    "codebooks must be in [1, " + std::to_string(tune::max_codebooks) + "] (tuning<op::embedding>::max_codebooks)");
    const index_t rows = batch * steps;
    if (rows == 0 || dim == 0) return;
    detail::require(rows <= 0x7fffffff, "embedding_fwd", "batch·steps must be below 2^31");
    detail::table_ptrs<device_t<W>, tune::max_codebooks> t{};
    for (int k = 0; k < codebooks; ++k) t.p[k] = dev(tables[k]);
    ETUDE_LAUNCH(detail::embedding_fwd_kernel, static_cast<unsigned>(rows), tune::threads, 0, current().stream())
        (dev(x), seq, t, dev(pos), steps, codebooks, dim);
    ETUDE_CUDA_CHECK_LAUNCH("embedding_fwd_kernel");
  }

  // dtables: a host array of `codebooks` device pointers (G: the gradients' storage type).
  template <class G, class X>
  static void embedding_bwd(G* const* dtables, const X* dx, const token_t* seq, index_t batch, int codebooks,
                            index_t steps, index_t dim) {
    using tune = tuning<op::embedding, X>;
    const index_t rows = batch * steps;
    if (rows == 0 || dim == 0) return;
    detail::require(rows <= 0x7fffffff, "embedding_bwd", "batch·steps must be below 2^31");
    context& ctx = current();
    const int n = static_cast<int>(rows);
    std::size_t sort_bytes = 0;
    ETUDE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const unsigned*>(nullptr),
                                                     static_cast<unsigned*>(nullptr), static_cast<const int*>(nullptr),
                                                     static_cast<int*>(nullptr), n, 0, 32, ctx.stream()));
    const std::size_t arr = context::round_up(sizeof(int) * static_cast<std::size_t>(n), 256);
    auto* base = static_cast<unsigned char*>(ctx.scratch(4 * arr + sort_bytes));
    auto* keys_in = reinterpret_cast<unsigned*>(base);
    auto* keys_out = reinterpret_cast<unsigned*>(base + arr);
    auto* rows_in = reinterpret_cast<int*>(base + 2 * arr);
    auto* rows_out = reinterpret_cast<int*>(base + 3 * arr);
    void* temp = base + 4 * arr;
    for (int k = 0; k < codebooks; ++k) {
      ETUDE_LAUNCH(detail::embedding_gather_keys, detail::grid_for(rows, 256, 8), 256, 0, ctx.stream())
          (keys_in, rows_in, seq, steps, codebooks, k, rows);
      ETUDE_CUDA_CHECK_LAUNCH("embedding_gather_keys");
      std::size_t bytes = sort_bytes;
      ETUDE_CUDA_CHECK(
          cub::DeviceRadixSort::SortPairs(temp, bytes, keys_in, keys_out, rows_in, rows_out, n, 0, 32, ctx.stream()));
      ETUDE_LAUNCH(detail::embedding_accumulate, static_cast<unsigned>(rows), tune::threads, 0, ctx.stream())
          (dev(dtables[k]), dev(dx), keys_out, rows_out, rows, dim);
      ETUDE_CUDA_CHECK_LAUNCH("embedding_accumulate");
    }
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_embedding;
}  // namespace etude::backend
