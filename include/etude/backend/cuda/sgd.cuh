// The SGD update with momentum (optionally Nesterov's) on the current stream (spec: ops/sgd.hpp),
// one pass over the parameters with the CPU backend's formula and operation order; scalars,
// gradient factor and skip flag in device memory as for AdamW (adamw.cuh).
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

template <class M, class G, class S, class P>
__device__ __forceinline__ void sgd_element(index_t i, M* p, const G* grad, S* buf, P* working, float lr, float mu,
                                            float wd, bool nesterov, bool first, float grad_scale) {
  const float pi = to_float(p[i]);
  const float g = to_float(grad[i]) * grad_scale + wd * pi;
  const S bs = from_float<S>(first ? g : mu * to_float(buf[i]) + g);
  buf[i] = bs;
  const float b = to_float(bs);
  const float next = pi - lr * (nesterov ? g + mu * b : b);
  const M stored = from_float<M>(next);
  p[i] = stored;
  if (working != nullptr) working[i] = std::is_same_v<M, P> ? from_float<P>(to_float(stored)) : from_float<P>(next);
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

// All three pointers are device memory; nothing changes when *skip != 0.
template <class M, class G, class S, class P = M>
void sgd_update(M* p, const G* grad, S* buf, index_t n, const optim::sgd_scalars* scalars,
                const double* grad_scale, const int* skip, P* working = nullptr) {
  if (n <= 0) return;
  using tune = tuning<op::elementwise, M>;
  detail::sgd_device_kernel<device_t<M>, device_t<G>, device_t<S>, device_t<P>, tune::unroll>
      <<<detail::elementwise_grid<tune>(n), tune::threads, 0, current().stream()>>>(
          dev(p), dev(grad), dev(buf), dev(working), n, scalars, grad_scale, skip);
  ETUDE_CUDA_CHECK_LAUNCH("sgd_device_kernel");
}

}  // namespace etude::cuda
