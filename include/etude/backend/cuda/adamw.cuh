// The AdamW update on the current stream (spec: ops/adamw.hpp), one pass over the parameters with
// the CPU backend's formula and operation order. The optimiser's scalars (formed in double on the
// host), the gradient factor (clip coefficient / loss scale, written by step_control) and the skip
// flag are device memory read when the kernel runs, so a step captured once as a CUDA graph takes
// every later update from the same graph. The fp32 master is updated and the 16-bit working copy
// written from it in the same pass. Not for: optimiser state allocation (the memory plan owns it).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/config/optim.hpp"
#include "etude/core/types.hpp"

namespace etude::cuda {

namespace detail {

// optim::adamw::scalars rounded to float, once per kernel, as the CPU rounds them.
struct adamw_coefficients {
  float step_size, bc2_sqrt, decay, w1, b2, w2, eps;
};

// One element of AdamW on g = grad·scale. M master, G gradient, S moments, P working copy
// (nullable): device types.
template <class M, class G, class S, class P>
__device__ __forceinline__ void adamw_element(index_t i, M* p, const G* grad, S* m, S* v, P* working,
                                              const adamw_coefficients& c, float scale) {
  const float g = to_float(grad[i]) * scale;
  float pi = to_float(p[i]) * c.decay;
  const float m0 = to_float(m[i]);
  const float mi = m0 + c.w1 * (g - m0);
  const float vi = to_float(v[i]) * c.b2 + c.w2 * g * g;
  const S ms = from_float<S>(mi), vs = from_float<S>(vi);
  m[i] = ms;
  v[i] = vs;
  pi -= c.step_size * to_float(ms) / (sqrtf(to_float(vs)) / c.bc2_sqrt + c.eps);
  const M stored = from_float<M>(pi);
  p[i] = stored;
  if (working != nullptr) working[i] = std::is_same_v<M, P> ? from_float<P>(to_float(stored)) : from_float<P>(pi);
}

// Every per-step value read from device memory: the optimiser's scalars (formed in double on the
// host, rounded to float here once, as the CPU rounds them), the gradient factor (clip coefficient
// / loss scale, from step_control) and a flag that skips the whole update.
template <class M, class G, class S, class P, int Unroll>
__global__ void adamw_device_kernel(M* p, const G* grad, S* m, S* v, P* working, index_t n,
                                    const optim::adamw::scalars* cp, const double* grad_scale, const int* skip) {
  if (*skip != 0) return;
  const optim::adamw::scalars d = *cp;
  const adamw_coefficients c{static_cast<float>(d.step_size), static_cast<float>(d.bc2_sqrt),
                             static_cast<float>(d.decay),     static_cast<float>(d.w1),
                             static_cast<float>(d.b2),        static_cast<float>(d.w2),
                             static_cast<float>(d.eps)};
  const float scale = static_cast<float>(*grad_scale);
  grid_stride<Unroll>(n, [&](index_t i) { adamw_element(i, p, grad, m, v, working, c, scale); });
}

}  // namespace detail

// All three pointers are device memory; nothing changes when *skip != 0.
template <class M, class G, class S, class P = M>
void adamw_update(M* p, const G* grad, S* m, S* v, index_t n, const optim::adamw::scalars* scalars,
                  const double* grad_scale, const int* skip, P* working = nullptr) {
  if (n <= 0) return;
  using tune = tuning<op::elementwise, M>;
  detail::adamw_device_kernel<device_t<M>, device_t<G>, device_t<S>, device_t<P>, tune::unroll>
      <<<detail::elementwise_grid<tune>(n), tune::threads, 0, current().stream()>>>(
          dev(p), dev(grad), dev(m), dev(v), dev(working), n, scalars, grad_scale, skip);
  ETUDE_CUDA_CHECK_LAUNCH("adamw_device_kernel");
}

}  // namespace etude::cuda
