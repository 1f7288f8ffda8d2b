// The AdamW update on the current stream (spec: ops/adamw.hpp), one pass over the parameters with
// the CPU backend's formula and operation order. The optimiser's scalars (formed in double on the
// host), the gradient factor (clip coefficient / loss scale, written by step_control) and the skip
// flag are device memory read when the kernel runs, so a step captured once as a CUDA graph takes
// every later update from the same graph. The fp32 master is updated and the 16-bit working copy
// written from it in the same pass. adamw_check, run before it, refuses an update that would store
// a non-finite value, through the same element arithmetic. Not for: optimiser state allocation (the memory plan owns it).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/step_control.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/config/optim.hpp"
#include "etude/core/types.hpp"
#include "etude/ops/step_control.hpp"

namespace etude::cuda {

namespace detail {

// optim::adamw::scalars rounded to float, once per kernel, as the CPU rounds them.
struct adamw_coefficients {
  float step_size, bc2_sqrt, decay, w1, b2, w2, eps;
};

// What one element of AdamW on g = grad·scale stores: the moments in their dtype, the weight in
// float (rounded to each copy's dtype by the caller). The update and its check both go through
// here, so the check sees exactly the values the update would store.
template <class S>
struct adamw_values {
  S m, v;
  float p;
};
template <class M, class G, class S>
__device__ __forceinline__ adamw_values<S> adamw_compute(index_t i, const M* p, const G* grad, const S* m, const S* v,
                                                         const adamw_coefficients& c, float scale) {
  const float g = to_float(grad[i]) * scale;
  float pi = to_float(p[i]) * c.decay;
  const float m0 = to_float(m[i]);
  const float mi = m0 + c.w1 * (g - m0);
  const float vi = to_float(v[i]) * c.b2 + c.w2 * g * g;
  const S ms = from_float<S>(mi), vs = from_float<S>(vi);
  pi -= c.step_size * to_float(ms) / (sqrtf(to_float(vs)) / c.bc2_sqrt + c.eps);
  return {ms, vs, pi};
}

// One element of AdamW. M master, G gradient, S moments, P working copy (nullable): device types.
template <class M, class G, class S, class P>
__device__ __forceinline__ void adamw_element(index_t i, M* p, const G* grad, S* m, S* v, P* working,
                                              const adamw_coefficients& c, float scale) {
  const adamw_values<S> e = adamw_compute(i, p, grad, m, v, c, scale);
  m[i] = e.m;
  v[i] = e.v;
  const M stored = from_float<M>(e.p);
  p[i] = stored;
  if (working != nullptr) working[i] = std::is_same_v<M, P> ? from_float<P>(to_float(stored)) : from_float<P>(e.p);
}

inline __device__ adamw_coefficients adamw_coefficients_of(const optim::adamw::scalars& d) {
  return {static_cast<float>(d.step_size), static_cast<float>(d.bc2_sqrt), static_cast<float>(d.decay),
          static_cast<float>(d.w1),        static_cast<float>(d.b2),       static_cast<float>(d.w2),
          static_cast<float>(d.eps)};
}

// The check's first pass (ops/adamw.hpp): per block, the smallest update_value_key of a value the
// update would store non-finite (no_refusal when none), over chunks of Chunk elements.
template <class M, class G, class S, class P, int Threads, int Chunk>
__global__ void __launch_bounds__(Threads)
    adamw_check_partial(const M* p, const G* grad, const S* m, const S* v, bool check_working, index_t n,
                        const optim::adamw::scalars* cp, const step_decision* d, index_t* partial) {
  if (d->skip != 0) return;  // read by every thread; only the last pass of the check writes it
  __shared__ index_t shared[32];
  const adamw_coefficients c = adamw_coefficients_of(*cp);
  const float scale = static_cast<float>(d->grad_scale);
  index_t first = no_refusal;
  const index_t chunks = (n + Chunk - 1) / Chunk;
  for (index_t ch = blockIdx.x; ch < chunks; ch += gridDim.x) {
    const index_t end = min(n, (ch + 1) * Chunk);
    for (index_t i = ch * Chunk + threadIdx.x; i < end; i += Threads) {
      const adamw_values<S> e = adamw_compute(i, p, grad, m, v, c, scale);
      const int what = !isfinite(to_float(e.m))                                          ? update_value_state0
                       : !isfinite(to_float(e.v))                                        ? update_value_state1
                       : !isfinite(to_float(from_float<M>(e.p)))                         ? update_value_weight
                       : check_working && !isfinite(to_float(from_float<P>(e.p))) ? update_value_working
                                                                                         : -1;
      if (what >= 0 && update_value_key(i, what) < first) first = update_value_key(i, what);
    }
  }
  first = block_reduce<Threads>(first, min_op{}, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = first;
}

// Every per-step value read from device memory: the optimiser's scalars (formed in double on the
// host, rounded to float here once, as the CPU rounds them), the gradient factor (clip coefficient
// / loss scale, from step_control) and a flag that skips the whole update.
template <class M, class G, class S, class P, int Unroll>
__global__ void adamw_device_kernel(M* p, const G* grad, S* m, S* v, P* working, index_t n,
                                    const optim::adamw::scalars* cp, const double* grad_scale, const int* skip) {
  if (*skip != 0) return;
  const adamw_coefficients c = adamw_coefficients_of(*cp);
  const float scale = static_cast<float>(*grad_scale);
  grid_stride<Unroll>(n, [&](index_t i) { adamw_element(i, p, grad, m, v, working, c, scale); });
}

}  // namespace detail

// AdamW's update and its check (ops/adamw.hpp); backend::cuda inherits them.
struct cuda_adamw {
  // All three pointers are device memory; nothing changes when *skip != 0.
  template <class M, class G, class S, class P = M>
  static void adamw_update(M* p, const G* grad, S* m, S* v, index_t n, const optim::adamw::scalars* scalars,
                           const double* grad_scale, const int* skip, P* working = nullptr) {
    if (n <= 0) return;
    using tune = tuning<op::elementwise, M>;
    ETUDE_LAUNCH((detail::adamw_device_kernel<device_t<M>, device_t<G>, device_t<S>, device_t<P>, tune::unroll>),
                 detail::elementwise_grid<tune>(n), tune::threads, 0, current().stream())
        (dev(p), dev(grad), dev(m), dev(v), dev(working), n, scalars, grad_scale, skip);
    ETUDE_CUDA_CHECK_LAUNCH("adamw_device_kernel");
  }

  // The check of the update (ops/adamw.hpp): d is device memory (the step's decision), read and, on a
  // refusal, written by the kernels, so the update that follows on the stream sees d->skip; no host
  // synchronisation. Two passes: per-block minima in the context's scratch, then one block.
  template <class M, class G, class S, class P = M>
  static void adamw_check(const M* p, const G* grad, const S* m, const S* v, index_t n,
                          const optim::adamw::scalars* scalars, step_decision* d, const P* working = nullptr) {
    if (n <= 0) return;
    using tune = tuning<op::reduce, M>;
    context& ctx = current();
    const int blocks = detail::update_check_blocks<tune>(n);
    auto* partial = static_cast<index_t*>(ctx.scratch(sizeof(index_t) * tune::max_blocks));
    // a working copy of another dtype can overflow where the master does not (fp16 above 65504)
    const bool check_working = working != nullptr && !std::is_same_v<device_t<P>, device_t<M>>;
    ETUDE_LAUNCH(
        (detail::adamw_check_partial<device_t<M>, device_t<G>, device_t<S>, device_t<P>, tune::threads, tune::chunk>),
        blocks, tune::threads, 0, ctx.stream())
        (dev(p), dev(grad), dev(m), dev(v), check_working, n, scalars, d, partial);
    ETUDE_CUDA_CHECK_LAUNCH("adamw_check_partial");
    ETUDE_LAUNCH(detail::refuse_first_kernel<tune::threads>, 1, tune::threads, 0, ctx.stream())(partial, blocks, d);
    ETUDE_CUDA_CHECK_LAUNCH("refuse_first_kernel");
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_adamw;
}  // namespace etude::backend
