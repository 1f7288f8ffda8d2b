// The CUDA body of the step-control op (ops/step_control.hpp): the decision between the gradient
// norm and the optimiser, in a one-thread kernel with the same double arithmetic as the CPU's
// (decide_step), the gradient clear that leaves gradients kept for an error report, and the last
// pass the optimisers' checks share (refuse_first_kernel). All read
// their inputs from device memory when they run, so a captured step takes them again at every
// replay.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "etude/backend/cuda/check.cuh"
#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"
#include "etude/ops/step_control.hpp"

namespace etude::cuda {

namespace detail {

template <int Unused = 0>
__global__ void step_control_kernel(const step_limits* in, const double* losses, int n, step_decision* out) {
  decide_step(*in, losses, n, *out);
}

template <int Unused = 0>
__global__ void share_refusal_kernel(const step_decision* d, index_t offset, std::int64_t* key) {
  *key = shared_refusal(*d, offset);
}
template <int Unused = 0>
__global__ void take_refusal_kernel(step_decision* d, const std::int64_t* key) {
  agree_refusal(*d, *key);
}

// Zeroes n bytes (in 16-byte words, then the tail) unless *keep.
template <int Unroll>
__global__ void clear_unless_kernel(unsigned char* p, index_t words, index_t bytes, const int* keep) {
  if (*keep != 0) return;
  auto* w = reinterpret_cast<uint4*>(p);
  grid_stride<Unroll>(words, [&](index_t i) { w[i] = make_uint4(0u, 0u, 0u, 0u); });
  if (blockIdx.x == 0)
    for (index_t i = words * 16 + threadIdx.x; i < bytes; i += blockDim.x) p[i] = 0;
}

// An optimiser check's per-block result when no value would be non-finite.
inline constexpr index_t no_refusal = INT64_MAX;

// The optimiser checks' last pass (adamw_check, sgd_check): the smallest of the per-block keys,
// and the refusal when there is one. min is exact, so the key is the same on every device.
template <int Threads>
__global__ void __launch_bounds__(Threads) refuse_first_kernel(const index_t* partial, int count, step_decision* d) {
  if (d->skip != 0) return;  // every thread reads it before thread 0 may write it (block_reduce syncs)
  __shared__ index_t shared[32];
  index_t first = no_refusal;
  for (int i = threadIdx.x; i < count; i += Threads) first = partial[i] < first ? partial[i] : first;
  first = block_reduce<Threads>(first, min_op{}, shared);
  if (threadIdx.x == 0 && first != no_refusal) refuse_update(*d, first);
}

// Blocks of a check's first pass: one per Tune::chunk elements, at most Tune::max_blocks.
template <class Tune>
inline int update_check_blocks(index_t n) {
  const index_t chunks = (n + Tune::chunk - 1) / Tune::chunk;
  return static_cast<int>(chunks < Tune::max_blocks ? chunks : Tune::max_blocks);
}

}  // namespace detail

// The step's control (ops/step_control.hpp); backend::cuda inherits it.
struct cuda_step_control {
  static void step_control(const step_limits* in, const double* losses, int n, step_decision* out) {
    ETUDE_LAUNCH(detail::step_control_kernel, 1, 1, 0, current().stream())(in, losses, n, out);
    ETUDE_CUDA_CHECK_LAUNCH("step_control_kernel");
  }

  static void share_refusal(const step_decision* d, index_t offset, std::int64_t* key) {
    ETUDE_LAUNCH(detail::share_refusal_kernel, 1, 1, 0, current().stream())(d, offset, key);
    ETUDE_CUDA_CHECK_LAUNCH("share_refusal_kernel");
  }

  static void take_refusal(step_decision* d, const std::int64_t* key) {
    ETUDE_LAUNCH(detail::take_refusal_kernel, 1, 1, 0, current().stream())(d, key);
    ETUDE_CUDA_CHECK_LAUNCH("take_refusal_kernel");
  }

  // x must be 16-byte aligned (device_buffer memory is).
  template <class T>
  static void clear_unless(T* x, index_t n, const int* keep) {
    if (n <= 0) return;
    using tune = tuning<op::elementwise, float>;
    const index_t bytes = n * static_cast<index_t>(sizeof(T)), words = bytes / 16;
    ETUDE_LAUNCH(detail::clear_unless_kernel<tune::unroll>, detail::elementwise_grid<tune>(words > 0 ? words : 1),
                 tune::threads, 0, current().stream())
        (reinterpret_cast<unsigned char*>(x), words, bytes, keep);
    ETUDE_CUDA_CHECK_LAUNCH("clear_unless_kernel");
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_step_control;
}  // namespace etude::backend
