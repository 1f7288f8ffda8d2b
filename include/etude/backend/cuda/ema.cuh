// The EMA of the weights on the current stream (spec: ops/ema.hpp): one grid-stride pass,
// (1 − w)·e + w·p in float, the CPU backend's formula; the weight and the skip flag in device memory.
#pragma once

#include <cuda_runtime.h>

#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"
#include "etude/ops/ema.hpp"

namespace etude::cuda {

namespace detail {

template <class M, int Unroll>
__global__ void ema_kernel(float* e, const M* p, index_t n, const ops::ema_scalars* sc, const int* skip) {
  if (*skip != 0 || sc->weight == 0.0) return;
  const float w = static_cast<float>(sc->weight), keep = static_cast<float>(1.0 - sc->weight);
  grid_stride<Unroll>(n, [&](index_t i) { e[i] = keep * e[i] + w * to_float(p[i]); });
}

}  // namespace detail

// The EMA update (ops/ema.hpp); backend::cuda inherits it. Every pointer is device memory.
struct cuda_ema {
  template <class M>
  static void ema_update(float* e, const M* p, index_t n, const ops::ema_scalars* sc, const int* skip) {
    if (n <= 0) return;
    using tune = tuning<op::elementwise, float>;
    ETUDE_LAUNCH((detail::ema_kernel<device_t<M>, tune::unroll>), detail::elementwise_grid<tune>(n), tune::threads, 0,
                 current().stream())
    (e, dev(p), n, sc, skip);
    ETUDE_CUDA_CHECK_LAUNCH("ema_kernel");
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_ema;
}  // namespace etude::backend
