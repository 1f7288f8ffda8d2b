// Fused softmax cross-entropy over rows of logits (rows, card), shaped for small cards (~2k
// classes): a block per row finds the max, the sum of exponentials and the log-sum-exp, writes the
// row's loss lse − logit[target] (double) to a per-row slot, and, when weight ≠ 0, overwrites the
// row in place with weight·(softmax − one-hot). Rows with target −1 (padding, pattern mask) add no
// loss and become zero (left alone when weight = 0). The loss sum is deterministic: one block adds
// the per-row values in a fixed order, in double. Spec: ops/softmax_xent.hpp.
// Not for: large vocabularies (a row is re-read from L2 three times).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/reduce.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"

namespace etude::cuda {

namespace detail {

// Row blockIdx.x: its loss into row_loss, and with weight ≠ 0 the gradient in place.
template <class D, int Threads>
__device__ __forceinline__ void softmax_xent_row(D* logits, const token_t* target, index_t card, float weight,
                                   double* row_loss) {
  __shared__ float shared[32];
  const index_t r = blockIdx.x;
  D* row = logits + r * card;
  const token_t t = target[r];
  if (t < 0) {
    if (weight != 0.0f)
      for (index_t j = threadIdx.x; j < card; j += Threads) row[j] = from_float<D>(0.0f);
    if (threadIdx.x == 0) row_loss[r] = 0.0;
    return;
  }
  float mx = -INFINITY;
  for (index_t j = threadIdx.x; j < card; j += Threads) mx = fmaxf(mx, to_float(row[j]));
  mx = block_reduce<Threads>(mx, max_op{}, shared);
  float sum = 0.0f;
  for (index_t j = threadIdx.x; j < card; j += Threads) sum += expf(to_float(row[j]) - mx);
  sum = block_reduce<Threads>(sum, sum_op{}, shared);
  const float lse = mx + logf(sum);
  const float target_logit = to_float(row[t]);  // read by every thread before anyone writes
  if (threadIdx.x == 0) row_loss[r] = static_cast<double>(lse) - static_cast<double>(target_logit);
  if (weight == 0.0f) return;
  __syncthreads();
  for (index_t j = threadIdx.x; j < card; j += Threads) {
    const float g = weight * expf(to_float(row[j]) - lse);
    row[j] = from_float<D>(j == t ? g - weight : g);
  }
}

// The weight read from device memory when the kernel runs.
template <class D, int Threads>
__global__ void __launch_bounds__(Threads)
    softmax_xent_kernel(D* logits, const token_t* target, index_t card, const float* weight,
                        double* row_loss) {
  softmax_xent_row<D, Threads>(logits, target, card, *weight, row_loss);
}

}  // namespace detail

// The loss (ops/softmax_xent.hpp); backend::cuda inherits it.
struct cuda_softmax_xent {
  // *loss += Σ rows' cross-entropy; logits rewritten as above. weight and loss are device memory,
  // read and written when the kernels run: a step captured once as a CUDA graph changes its loss
  // normalisation and loss scale between replays. No synchronisation.
  template <class T>
  static void softmax_xent(T* logits, const token_t* target, index_t rows, index_t card, const float* weight,
                           double* loss) {
    detail::require(card > 0 && rows >= 0 && rows <= 0x7fffffff, "softmax_xent", "card must be positive, rows below 2^31");
    if (rows == 0) return;
    using tune = tuning<op::softmax_xent, T>;
    context& ctx = current();
    auto* row_loss = static_cast<double*>(ctx.scratch(sizeof(double) * static_cast<std::size_t>(rows)));
    ETUDE_LAUNCH((detail::softmax_xent_kernel<device_t<T>, tune::threads>), static_cast<unsigned>(rows), tune::threads, 0,
                 ctx.stream())
        (dev(logits), target, card, weight, row_loss);
    ETUDE_CUDA_CHECK_LAUNCH("softmax_xent_kernel");
    ETUDE_LAUNCH((detail::sum_partials<256, true>), 1, 256, 0, ctx.stream())(row_loss, static_cast<int>(rows), loss);
    ETUDE_CUDA_CHECK_LAUNCH("sum_partials");
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_softmax_xent;
}  // namespace etude::backend
