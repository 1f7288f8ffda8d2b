// LayerNorm on the current stream (eps 1e-5, biased variance, statistics accumulated in double
// like the CPU backend; mean and rstd saved as float per row):
//   layernorm_fwd            y = (x − mean)·rstd·gamma + beta
//   residual_layernorm_fwd   x_mid = x + r (rounded to the storage type), then LayerNorm of x_mid
//   layernorm_bwd            dx += LayerNorm'(dy); dgamma += Σ_rows dy·x̂; dbeta += Σ_rows dy
// A warp owns a row, with 16-byte accesses (dim must be a multiple of tuning's vec). dgamma and
// dbeta are deterministic without atomics: each block writes per-column partials over its fixed
// `bwd_rows` rows, and a second pass adds them in block order.
// Not for: RMSNorm or LayerNorm without an affine part.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/detail/launch.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"

namespace etude::cuda {

namespace detail {

inline constexpr double layernorm_eps = 1e-5;

// Y, X, R, W: device types of y, x (and x_mid), the residual r, gamma and beta.
template <class Y, class X, class W, int V, int Warps>
__global__ void __launch_bounds__(32 * Warps)
    layernorm_fwd_kernel(Y* y, float* mean, float* rstd, const X* x, const X* res, X* x_mid, const W* gamma,
                         const W* beta, index_t rows, int dim) {
  const int lane = threadIdx.x % 32;
  const index_t row = static_cast<index_t>(blockIdx.x) * Warps + threadIdx.x / 32;
  if (row >= rows) return;
  const X* xr = x + row * dim;
  double sum = 0.0;
  for (int j = lane * V; j < dim; j += 32 * V) {
    float v[V];
    load_n<V>(xr + j, v);
    if (res != nullptr) {
      float r[V];
      load_n<V>(res + row * dim + j, r);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = to_float(from_float<X>(v[i] + r[i]));  // what x_mid stores
      store_n<V>(x_mid + row * dim + j, v);
    }
#pragma unroll
    for (int i = 0; i < V; ++i) sum += v[i];
  }
  // later passes read x_mid, which this lane itself wrote at the same positions
  if (res != nullptr) xr = x_mid + row * dim;
  const double mu = warp_reduce(sum, sum_op{}) / dim;
  double sq = 0.0;
  for (int j = lane * V; j < dim; j += 32 * V) {
    float v[V];
    load_n<V>(xr + j, v);
#pragma unroll
    for (int i = 0; i < V; ++i) sq += (v[i] - mu) * (v[i] - mu);
  }
  sq = warp_reduce(sq, sum_op{});
  const auto m = static_cast<float>(mu);
  const auto rs = static_cast<float>(1.0 / sqrt(sq / dim + layernorm_eps));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
  for (int j = lane * V; j < dim; j += 32 * V) {
    float v[V], g[V], b[V];
    load_n<V>(xr + j, v);
    load_n<V>(gamma + j, g);
    load_n<V>(beta + j, b);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = (v[i] - m) * rs * g[i] + b[i];
    store_n<V>(y + row * dim + j, v);
  }
}

// Rows [blockIdx.x·Rows, +Rows): dx for each row (a warp per row), then per-column partial sums
// of dy·x̂ and dy over those rows into partial (2, blocks, dim).
template <class DX, class DY, class X, class W, int V, int Warps, int Rows>
__global__ void __launch_bounds__(32 * Warps)
    layernorm_bwd_kernel(DX* dx, float* partial, const DY* dy, const X* x, const float* mean, const float* rstd,
                         const W* gamma, index_t rows, int dim) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const index_t row0 = static_cast<index_t>(blockIdx.x) * Rows;
  const index_t row1 = min(rows, row0 + Rows);
  for (index_t row = row0 + warp; row < row1; row += Warps) {
    const X* xr = x + row * dim;
    const DY* gr = dy + row * dim;
    const float m = mean[row], rs = rstd[row];
    double s1 = 0.0, s2 = 0.0;
    for (int j = lane * V; j < dim; j += 32 * V) {
      float xv[V], gv[V], w[V];
      load_n<V>(xr + j, xv);
      load_n<V>(gr + j, gv);
      load_n<V>(gamma + j, w);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float g = gv[i] * w[i];
        s1 += g;
        s2 += g * ((xv[i] - m) * rs);
      }
    }
    const auto a = static_cast<float>(warp_reduce(s1, sum_op{}) / dim);
    const auto c = static_cast<float>(warp_reduce(s2, sum_op{}) / dim);
    for (int j = lane * V; j < dim; j += 32 * V) {
      float xv[V], gv[V], w[V], d[V];
      load_n<V>(xr + j, xv);
      load_n<V>(gr + j, gv);
      load_n<V>(gamma + j, w);
      load_n<V>(dx + row * dim + j, d);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float xhat = (xv[i] - m) * rs;
        d[i] += rs * (gv[i] * w[i] - a - xhat * c);
      }
      store_n<V>(dx + row * dim + j, d);
    }
  }
  const index_t blocks = gridDim.x;
  for (int j = threadIdx.x; j < dim; j += 32 * Warps) {
    float g = 0.0f, b = 0.0f;
    for (index_t row = row0; row < row1; ++row) {
      const float d = to_float(dy[row * dim + j]);
      g += d * ((to_float(x[row * dim + j]) - mean[row]) * rstd[row]);
      b += d;
    }
    partial[blockIdx.x * static_cast<index_t>(dim) + j] = g;
    partial[(blocks + blockIdx.x) * static_cast<index_t>(dim) + j] = b;
  }
}

// dgamma[j] += Σ_blocks partial[0][block][j], dbeta likewise, blocks in order.
template <class G>
__global__ void layernorm_param_grads(G* dgamma, G* dbeta, const float* partial, int blocks, int dim) {
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < dim; j += gridDim.x * blockDim.x) {
    double g = 0.0, b = 0.0;
    for (int k = 0; k < blocks; ++k) {
      g += partial[static_cast<index_t>(k) * dim + j];
      b += partial[static_cast<index_t>(blocks + k) * dim + j];
    }
    dgamma[j] = from_float<G>(to_float(dgamma[j]) + static_cast<float>(g));
    dbeta[j] = from_float<G>(to_float(dbeta[j]) + static_cast<float>(b));
  }
}

template <class T>
void check_layernorm(const char* op, index_t rows, index_t dim, std::initializer_list<const void*> ptrs) {
  constexpr int vec = tuning<op::layernorm, T>::vec;
  require(rows >= 0 && dim > 0 && dim <= (1 << 30), op, "rows must be non-negative and dim in [1, 2^30]");
  require(dim % vec == 0, op,
          "dim (" + std::to_string(dim) + ") must be a multiple of the vector width " + std::to_string(vec) +
              " (tuning<op::layernorm, T>::vec)");
  for (const void* p : ptrs) require(aligned(p, 16), op, "tensors must be 16-byte aligned");
}

template <class Y, class X, class W>
void layernorm_fwd_launch(Y* y, float* mean, float* rstd, const X* x, const X* res, X* x_mid, const W* gamma,
                          const W* beta, index_t rows, index_t dim) {
  using tune = tuning<op::layernorm, X>;
  const auto blocks = static_cast<unsigned>((rows + tune::warps - 1) / tune::warps);
  ETUDE_LAUNCH((layernorm_fwd_kernel<device_t<Y>, device_t<X>, device_t<W>, tune::vec, tune::warps>), blocks,
               32 * tune::warps, 0, current().stream())
      (dev(y), mean, rstd, dev(x), dev(res), dev(x_mid), dev(gamma), dev(beta), rows, static_cast<int>(dim));
  ETUDE_CUDA_CHECK_LAUNCH("layernorm_fwd_kernel");
}

}  // namespace detail

// LayerNorm (ops/layernorm.hpp), with its residual fusion; backend::cuda inherits it.
struct cuda_layernorm {
  // y = LayerNorm(x)·gamma + beta; mean, rstd (rows) in float. Y, X: activations; W: parameters.
  template <class Y, class X, class W>
  static void layernorm_fwd(Y* y, float* mean, float* rstd, const X* x, const W* gamma, const W* beta, index_t rows,
                            index_t dim) {
    detail::check_layernorm<X>("layernorm_fwd", rows, dim, {y, x, gamma, beta});
    if (rows == 0) return;
    detail::layernorm_fwd_launch(y, mean, rstd, x, static_cast<const X*>(nullptr), static_cast<X*>(nullptr), gamma,
                                 beta, rows, dim);
  }

  static constexpr bool fuses_residual_layernorm = true;
  // x_mid = x + r, y = LayerNorm(x_mid): the residual add fused into the norm that follows it.
  template <class Y, class X, class W>
  static void residual_layernorm_fwd(X* x_mid, Y* y, float* mean, float* rstd, const X* x, const X* r, const W* gamma,
                                     const W* beta, index_t rows, index_t dim) {
    detail::check_layernorm<X>("residual_layernorm_fwd", rows, dim, {x_mid, y, x, r, gamma, beta});
    if (rows == 0) return;
    detail::layernorm_fwd_launch(y, mean, rstd, x, r, x_mid, gamma, beta, rows, dim);
  }

  // dx += LayerNorm'(dy); dgamma += Σ dy·x̂; dbeta += Σ dy (G: the gradients' storage type).
  template <class DX, class G, class DY, class X, class W>
  static void layernorm_bwd(DX* dx, G* dgamma, G* dbeta, const DY* dy, const X* x, const float* mean, const float* rstd,
                            const W* gamma, index_t rows, index_t dim) {
    detail::check_layernorm<X>("layernorm_bwd", rows, dim, {dx, dy, x, gamma});
    if (rows == 0) return;
    using tune = tuning<op::layernorm, X>;
    context& ctx = current();
    const index_t blocks = (rows + tune::bwd_rows - 1) / tune::bwd_rows;
    detail::require(blocks <= (index_t{1} << 30), "layernorm_bwd", "too many rows");
    auto* partial = static_cast<float*>(ctx.scratch(sizeof(float) * 2 * static_cast<std::size_t>(blocks * dim)));
    ETUDE_LAUNCH((detail::layernorm_bwd_kernel<device_t<DX>, device_t<DY>, device_t<X>, device_t<W>, tune::vec,
                                               tune::warps, tune::bwd_rows>),
                 static_cast<unsigned>(blocks), 32 * tune::warps, 0, ctx.stream())
        (dev(dx), partial, dev(dy), dev(x), mean, rstd, dev(gamma), rows, static_cast<int>(dim));
    ETUDE_CUDA_CHECK_LAUNCH("layernorm_bwd_kernel");
    ETUDE_LAUNCH(detail::layernorm_param_grads<device_t<G>>, static_cast<unsigned>((dim + 255) / 256), 256, 0,
                 ctx.stream())
        (dev(dgamma), dev(dbeta), partial, static_cast<int>(blocks), static_cast<int>(dim));
    ETUDE_CUDA_CHECK_LAUNCH("layernorm_param_grads");
  }
};

}  // namespace etude::cuda

namespace etude::backend {
using ::etude::cuda::cuda_layernorm;
}  // namespace etude::backend
