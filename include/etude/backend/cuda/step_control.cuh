// The CUDA body of the step-control op (ops/step_control.hpp): the decision between the gradient
// norm and the optimiser, in a one-thread kernel with the same double arithmetic as the CPU's
// (decide_step), and the gradient clear that leaves gradients kept for an error report. Both read
// their inputs from device memory when they run, so a captured step takes them again at every
// replay.
#pragma once

#include <cuda_runtime.h>

#include "etude/backend/cuda/check.cuh"
#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"
#include "etude/ops/step_control.hpp"

namespace etude::cuda {

namespace detail {

template <int Unused = 0>
__global__ void step_control_kernel(const step_limits* in, const double* losses, int n, step_decision* out) {
  decide_step(*in, losses, n, *out);
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

}  // namespace detail

inline void step_control(const step_limits* in, const double* losses, int n, step_decision* out) {
  detail::step_control_kernel<<<1, 1, 0, current().stream()>>>(in, losses, n, out);
  ETUDE_CUDA_CHECK_LAUNCH("step_control_kernel");
}

// x must be 16-byte aligned (device_buffer memory is).
template <class T>
void clear_unless(T* x, index_t n, const int* keep) {
  if (n <= 0) return;
  using tune = tuning<op::elementwise, float>;
  const index_t bytes = n * static_cast<index_t>(sizeof(T)), words = bytes / 16;
  detail::clear_unless_kernel<tune::unroll>
      <<<detail::elementwise_grid<tune>(words > 0 ? words : 1), tune::threads, 0, current().stream()>>>(
          reinterpret_cast<unsigned char*>(x), words, bytes, keep);
  ETUDE_CUDA_CHECK_LAUNCH("clear_unless_kernel");
}

}  // namespace etude::cuda
