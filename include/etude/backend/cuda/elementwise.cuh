// Elementwise ops on the current stream: copy (with dtype conversion), fill_zero, AudioCraft's
// sinusoidal positions, exact-erf GELU forward and backward, dropout (ops/dropout.hpp).
// Grid-stride loops, several elements in flight per thread (tuning<op::elementwise, T>). Values
// are widened to float, computed, and rounded once on store.
// Not for: reductions (reduce.cuh) or row-wise ops (layernorm.cuh, softmax_xent.cuh).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"
#include "etude/ops/dropout.hpp"

namespace etude::cuda {

namespace detail {

template <class D, class S, int Unroll>
__global__ void convert_kernel(D* dst, const S* src, index_t n) {
  grid_stride<Unroll>(n, [&](index_t i) { dst[i] = from_float<D>(to_float(src[i])); });
}

// dst += src: a microbatch's gradients added to the step's, one rounding per element.
template <class T, int Unroll>
__global__ void accumulate_kernel(T* dst, const T* src, index_t n) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    grid_stride<Unroll>(n, [&](index_t i) { dst[i] = dst[i] + src[i]; });
  } else {
    grid_stride<Unroll>(n, [&](index_t i) { dst[i] = from_float<T>(to_float(dst[i]) + to_float(src[i])); });
  }
}

__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)); }

template <class D, int Unroll>
__global__ void gelu_fwd_kernel(D* y, const D* x, index_t n) {
  grid_stride<Unroll>(n, [&](index_t i) { y[i] = from_float<D>(gelu(to_float(x[i]))); });
}

template <class D, int Unroll>
__global__ void gelu_bwd_kernel(D* dy, const D* x, index_t n) {
  grid_stride<Unroll>(n, [&](index_t i) {
    const float v = to_float(x[i]);
    const float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752440f));
    const float pdf = 0.398942280401432677940f * expf(-0.5f * v * v);
    dy[i] = from_float<D>(to_float(dy[i]) * (cdf + v * pdf));
  });
}

// pre = GELU input (already there), act = GELU(pre).
template <class D, int Unroll>
__global__ void gelu_rows_kernel(D* act, const D* pre, index_t rows, index_t cols, index_t ld) {
  grid_stride<Unroll>(rows * cols, [&](index_t i) {
    const index_t r = i / cols, c = i % cols;
    act[r * ld + c] = from_float<D>(gelu(to_float(pre[r * ld + c])));
  });
}

// Dropout with ops/dropout.hpp's counter-based mask: y = m·x or y += m·x. The product is rounded
// before the add (__fmul_rn: no contraction into an FMA), as the CPU computes it.
template <class Y, class X, int Unroll>
__global__ void dropout_kernel(Y* y, index_t ldy, const X* x, index_t ldx, index_t rows, index_t cols,
                               const ops::dropout_scalars* key, std::uint64_t site, index_t row0, bool accumulate) {
  const ops::dropout_scalars k = *key;
  const float scale = static_cast<float>(k.scale);
  grid_stride<Unroll>(rows * cols, [&](index_t i) {
    const index_t r = i / cols, c = i % cols;
    const float v = ops::dropout_keeps(k, site, row0 + r, c) ? __fmul_rn(to_float(x[r * ldx + c]), scale) : 0.0f;
    Y* out = y + r * ldy + c;
    *out = from_float<Y>(accumulate ? __fadd_rn(to_float(*out), v) : v);
  });
}

// Computed in double and rounded once, like the CPU backend.
template <class D>
__global__ void sinusoid_kernel(D* out, index_t steps, index_t dim) {
  const index_t half = dim / 2;
  grid_stride<1>(steps * half, [&](index_t i) {
    const index_t s = i / half, j = i % half;
    const double phase = static_cast<double>(s) / pow(10000.0, static_cast<double>(j) / static_cast<double>(half - 1));
    out[s * dim + j] = from_float<D>(static_cast<float>(cos(phase)));
    out[s * dim + half + j] = from_float<D>(static_cast<float>(sin(phase)));
  });
}

}  // namespace detail

// act(rows, cols) = GELU(pre) for row-major tensors with leading dimension ld.
template <class T>
void gelu_rows(T* act, const T* pre, index_t rows, index_t cols, index_t ld) {
  if (rows <= 0 || cols <= 0) return;
  using tune = tuning<op::elementwise, T>;
  ETUDE_LAUNCH((detail::gelu_rows_kernel<device_t<T>, tune::unroll>), detail::elementwise_grid<tune>(rows * cols),
               tune::threads, 0, current().stream())
      (dev(act), dev(pre), rows, cols, ld);
  ETUDE_CUDA_CHECK_LAUNCH("gelu_rows_kernel");
}

// The elementwise ops (ops/elementwise.hpp) and the sinusoid table (ops/embedding.hpp); backend::cuda
// inherits them.
struct cuda_elementwise {
  // dst = src, converting when the types differ (rounded to nearest even when narrowing).
  template <class Dst, class Src>
  static void copy(Dst* dst, const Src* src, index_t n) {
    if (n <= 0) return;
    context& ctx = current();
    if constexpr (std::is_same_v<std::remove_const_t<Dst>, std::remove_const_t<Src>>) {
      ETUDE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(Dst), cudaMemcpyDeviceToDevice,
                                       ctx.stream()));
    } else {
      using tune = tuning<op::elementwise, Dst>;
      ETUDE_LAUNCH((detail::convert_kernel<device_t<Dst>, device_t<Src>, tune::unroll>),
                   detail::elementwise_grid<tune>(n), tune::threads, 0, ctx.stream())
          (dev(dst), dev(src), n);
      ETUDE_CUDA_CHECK_LAUNCH("convert_kernel");
    }
  }

  // All bits zero: +0 in float, bf16 and fp16.
  template <class T>
  static void fill_zero(T* dst, index_t n) {
    if (n <= 0) return;
    ETUDE_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<std::size_t>(n) * sizeof(T), current().stream()));
  }

  template <class T>
  static void accumulate(T* dst, const T* src, index_t n) {
    if (n <= 0) return;
    using tune = tuning<op::elementwise, T>;
    ETUDE_LAUNCH((detail::accumulate_kernel<device_t<T>, tune::unroll>), detail::elementwise_grid<tune>(n), tune::threads,
                 0, current().stream())
        (dev(dst), dev(src), n);
    ETUDE_CUDA_CHECK_LAUNCH("accumulate_kernel");
  }

  // out (steps, dim): cos of the first half, sin of the second, periods 10000^(j / (half − 1)).
  template <class T>
  static void sinusoid(T* out, index_t steps, index_t dim) {
    detail::require(dim % 2 == 0 && dim >= 4, "sinusoid", "dim must be even and at least 4");
    if (steps <= 0) return;
    ETUDE_LAUNCH(detail::sinusoid_kernel, detail::grid_for(steps * (dim / 2), 256, 8), 256, 0, current().stream())
        (dev(out), steps, dim);
    ETUDE_CUDA_CHECK_LAUNCH("sinusoid_kernel");
  }

  // Dropout with ops/dropout.hpp's counter-based mask (the key read from device memory when the
  // kernel runs).
  template <class Y, class X>
  static void dropout(Y* y, index_t ldy, const X* x, index_t ldx, index_t rows, index_t cols,
                      const ops::dropout_scalars* key, std::uint64_t site, index_t row0, bool accumulate) {
    if (rows <= 0 || cols <= 0) return;
    using tune = tuning<op::elementwise, Y>;
    ETUDE_LAUNCH((detail::dropout_kernel<device_t<Y>, device_t<X>, tune::unroll>),
                 detail::elementwise_grid<tune>(rows * cols), tune::threads, 0, current().stream())
        (dev(y), ldy, dev(x), ldx, rows, cols, key, site, row0, accumulate);
    ETUDE_CUDA_CHECK_LAUNCH("dropout_kernel");
  }

  // y = x·Φ(x), exact erf.
  template <class T>
  static void gelu_fwd(T* y, const T* x, index_t n) {
    if (n <= 0) return;
    using tune = tuning<op::elementwise, T>;
    ETUDE_LAUNCH((detail::gelu_fwd_kernel<device_t<T>, tune::unroll>), detail::elementwise_grid<tune>(n), tune::threads,
                 0, current().stream())
        (dev(y), dev(x), n);
    ETUDE_CUDA_CHECK_LAUNCH("gelu_fwd_kernel");
  }

  // dy ← dy · GELU'(x), in place.
  template <class T>
  static void gelu_bwd(T* dy, const T* x, index_t n) {
    if (n <= 0) return;
    using tune = tuning<op::elementwise, T>;
    ETUDE_LAUNCH((detail::gelu_bwd_kernel<device_t<T>, tune::unroll>), detail::elementwise_grid<tune>(n), tune::threads,
                 0, current().stream())
        (dev(dy), dev(x), n);
    ETUDE_CUDA_CHECK_LAUNCH("gelu_bwd_kernel");
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_elementwise;
}  // namespace etude::backend
