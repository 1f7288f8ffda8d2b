// Deterministic reductions over device arrays (spec: ops/reduce.hpp): the sum of squares (the
// global gradient norm²) and the finiteness check. Two passes for the sum: fixed chunks of `chunk`
// elements, at most `max_blocks` partials (both functions of n only), a fixed tree in each block,
// then one block adds the partials in index order, all in double: the same bits on every run and
// every device. sum_squares leaves its result in device memory, so a step needs no host
// synchronisation; all_finite synchronises and returns (the error report, off the step's path).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"

namespace etude::cuda {

namespace detail {

template <class D, int Threads, int Chunk>
__global__ void __launch_bounds__(Threads) sum_squares_partial(const D* x, index_t n, double* partial) {
  __shared__ double shared[32];
  double acc = 0.0;
  const index_t chunks = (n + Chunk - 1) / Chunk;
  for (index_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const index_t end = min(n, (c + 1) * Chunk);
    for (index_t i = c * Chunk + threadIdx.x; i < end; i += Threads) {
      const double v = to_float(x[i]);
      acc += v * v;
    }
  }
  acc = block_reduce<Threads>(acc, sum_op{}, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// *out (+)= Σ partial[0 .. count), in a fixed order: added with Accumulate, else written.
template <int Threads, bool Accumulate>
__global__ void __launch_bounds__(Threads) sum_partials(const double* partial, int count, double* out) {
  __shared__ double shared[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += Threads) acc += partial[i];
  acc = block_reduce<Threads>(acc, sum_op{}, shared);
  if (threadIdx.x == 0) *out = Accumulate ? *out + acc : acc;
}

template <class D, int Unroll>
__global__ void non_finite_kernel(const D* x, index_t n, int* bad) {
  bool found = false;
  grid_stride<Unroll>(n, [&](index_t i) { found |= !isfinite(to_float(x[i])); });
  if (found) *bad = 1;  // every writer stores the same value
}

}  // namespace detail

// Sets *bad (device int) to 1 when x holds a NaN or an infinity; never clears it, so several
// tensors can be checked into one flag.
template <class T>
void all_finite_async(const T* x, index_t n, int* bad) {
  if (n <= 0) return;
  using tune = tuning<op::elementwise, T>;
  ETUDE_LAUNCH((detail::non_finite_kernel<device_t<T>, tune::unroll>), detail::elementwise_grid<tune>(n), tune::threads,
               0, current().stream())
      (dev(x), n, bad);
  ETUDE_CUDA_CHECK_LAUNCH("non_finite_kernel");
}

// The reductions (ops/reduce.hpp); backend::cuda inherits them.
struct cuda_reduce {
  // *out = Σ x² in double, deterministic; out is device memory. No synchronisation.
  template <class T>
  static void sum_squares(const T* x, index_t n, double* out) {
    if (n <= 0) {
      ETUDE_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), current().stream()));
      return;
    }
    using tune = tuning<op::reduce, T>;
    context& ctx = current();
    const index_t chunks = (n + tune::chunk - 1) / tune::chunk;
    const int blocks = static_cast<int>(std::min<index_t>(chunks, tune::max_blocks));
    auto* partial = static_cast<double*>(ctx.scratch(sizeof(double) * tune::max_blocks));
    ETUDE_LAUNCH((detail::sum_squares_partial<device_t<T>, tune::threads, tune::chunk>), blocks, tune::threads, 0,
                 ctx.stream())
        (dev(x), n, partial);
    ETUDE_CUDA_CHECK_LAUNCH("sum_squares_partial");
    ETUDE_LAUNCH((detail::sum_partials<tune::threads, false>), 1, tune::threads, 0, ctx.stream())(partial, blocks, out);
    ETUDE_CUDA_CHECK_LAUNCH("sum_partials");
  }

  // No NaN or infinity in x? Synchronises the stream.
  template <class T>
  static bool all_finite(const T* x, index_t n) {
    context& ctx = current();
    device_buffer<int> bad(1);
    ETUDE_CUDA_CHECK(cudaMemsetAsync(bad.data(), 0, sizeof(int), ctx.stream()));
    all_finite_async(x, n, bad.data());
    int host = 0;
    ETUDE_CUDA_CHECK(cudaMemcpyAsync(&host, bad.data(), sizeof(int), cudaMemcpyDeviceToHost, ctx.stream()));
    ctx.synchronize();
    return host == 0;
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_reduce;
}  // namespace etude::backend
