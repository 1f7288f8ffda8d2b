// The SGD update with momentum (optionally Nesterov's) on the current stream (spec: ops/sgd.hpp),
// one pass over the parameters with the CPU backend's formula and operation order; scalars,
// gradient factor and skip flag in device memory as for AdamW (adamw.cuh); sgd_check, its check,
// as adamw_check.
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

// What one element of SGD stores: the buffer in its dtype, the weight in float. The update and its
// check both go through here.
template <class S>
struct sgd_values {
  S buf;
  float p;
};
template <class M, class G, class S>
__device__ __forceinline__ sgd_values<S> sgd_compute(index_t i, const M* p, const G* grad, const S* buf, float lr,
                                                     float mu, float wd, bool nesterov, bool first, float grad_scale) {
  const float pi = to_float(p[i]);
  const float g = to_float(grad[i]) * grad_scale + wd * pi;
  const S bs = from_float<S>(first ? g : mu * to_float(buf[i]) + g);
  const float b = to_float(bs);
  return {bs, pi - lr * (nesterov ? g + mu * b : b)};
}

template <class M, class G, class S, class P>
__device__ __forceinline__ void sgd_element(index_t i, M* p, const G* grad, S* buf, P* working, float lr, float mu,
                                            float wd, bool nesterov, bool first, float grad_scale) {
  const sgd_values<S> e = sgd_compute(i, p, grad, buf, lr, mu, wd, nesterov, first, grad_scale);
  buf[i] = e.buf;
  const M stored = from_float<M>(e.p);
  p[i] = stored;
  if (working != nullptr) working[i] = std::is_same_v<M, P> ? from_float<P>(to_float(stored)) : from_float<P>(e.p);
}

// The check's first pass (ops/sgd.hpp), as adamw_check_partial.
template <class M, class G, class S, class P, int Threads, int Chunk>
__global__ void __launch_bounds__(Threads)
    sgd_check_partial(const M* p, const G* grad, const S* buf, bool check_working, index_t n,
                      const optim::sgd_scalars* cp, const step_decision* d, index_t* partial) {
  if (d->skip != 0) return;
  __shared__ index_t shared[32];
  const optim::sgd_scalars c = *cp;
  const float scale = static_cast<float>(d->grad_scale);
  const float lr = static_cast<float>(c.lr), mu = static_cast<float>(c.momentum), wd = static_cast<float>(c.weight_decay);
  index_t first = no_refusal;
  const index_t chunks = (n + Chunk - 1) / Chunk;
  for (index_t ch = blockIdx.x; ch < chunks; ch += gridDim.x) {
    const index_t end = min(n, (ch + 1) * Chunk);
    for (index_t i = ch * Chunk + threadIdx.x; i < end; i += Threads) {
      const sgd_values<S> e = sgd_compute(i, p, grad, buf, lr, mu, wd, c.nesterov != 0, c.first != 0, scale);
      const int what = !isfinite(to_float(e.buf))                                        ? update_value_state0
                       : !isfinite(to_float(from_float<M>(e.p)))                         ? update_value_weight
                       : check_working && !isfinite(to_float(from_float<P>(e.p))) ? update_value_working
                                                                                         : -1;
      if (what >= 0 && update_value_key(i, what) < first) first = update_value_key(i, what);
    }
  }
  first = block_reduce<Threads>(first, min_op{}, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = first;
}

template <class M, class G, class S, class P, int Unroll>
__global__ void sgd_device_kernel(M* p, const G* grad, S* buf, P* working, index_t n, const optim::sgd_scalars* cp,
                                  const double* grad_scale, const int* skip) {
  if (*skip != 0) return;
  const optim::sgd_scalars c = *cp;
  const float scale = static_cast<float>(*grad_scale);
  const float lr = static_cast<float>(c.lr), mu = static_cast<float>(c.momentum), wd = static_cast<float>(c.weight_decay);
  grid_stride<Unroll>(n, [&](index_t i) {
    sgd_element(i, p, grad, buf, working, lr, mu, wd, c.nesterov != 0, c.first != 0, scale);
  });
}

}  // namespace detail

// SGD's update and its check (ops/sgd.hpp); backend::cuda inherits them.
struct cuda_sgd {
  // All three pointers are device memory; nothing changes when *skip != 0.
  template <class M, class G, class S, class P = M>
  static void sgd_update(M* p, const G* grad, S* buf, index_t n, const optim::sgd_scalars* scalars,
                         const double* grad_scale, const int* skip, P* working = nullptr) {
    if (n <= 0) return;
    using tune = tuning<op::elementwise, M>;
    ETUDE_LAUNCH((detail::sgd_device_kernel<device_t<M>, device_t<G>, device_t<S>, device_t<P>, tune::unroll>),
                 detail::elementwise_grid<tune>(n), tune::threads, 0, current().stream())
        (dev(p), dev(grad), dev(buf), dev(working), n, scalars, grad_scale, skip);
    ETUDE_CUDA_CHECK_LAUNCH("sgd_device_kernel");
  }

  // The check of the update (ops/sgd.hpp), as adamw_check: d is the step's decision in device memory.
  template <class M, class G, class S, class P = M>
  static void sgd_check(const M* p, const G* grad, const S* buf, index_t n, const optim::sgd_scalars* scalars,
                        step_decision* d, const P* working = nullptr) {
    if (n <= 0) return;
    using tune = tuning<op::reduce, M>;
    context& ctx = current();
    const int blocks = detail::update_check_blocks<tune>(n);
    auto* partial = static_cast<index_t*>(ctx.scratch(sizeof(index_t) * tune::max_blocks));
    const bool check_working = working != nullptr && !std::is_same_v<device_t<P>, device_t<M>>;
    ETUDE_LAUNCH(
        (detail::sgd_check_partial<device_t<M>, device_t<G>, device_t<S>, device_t<P>, tune::threads, tune::chunk>),
        blocks, tune::threads, 0, ctx.stream())
        (dev(p), dev(grad), dev(buf), check_working, n, scalars, d, partial);
    ETUDE_CUDA_CHECK_LAUNCH("sgd_check_partial");
    ETUDE_LAUNCH(detail::refuse_first_kernel<tune::threads>, 1, tune::threads, 0, ctx.stream())(partial, blocks, d);
    ETUDE_CUDA_CHECK_LAUNCH("refuse_first_kernel");
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_sgd;
}  // namespace etude::backend
