// Fused optimiser updates on the current stream, one pass over the parameters, with the CPU
// backend's signatures, formulas and operation order (PyTorch's AdamW and SGD):
//   adamw_update: g = grad · grad_scale (· *device_scale when given), where the factors carry the
//     clip coefficient and 1/loss-scale (the device scale lets a step clip without a host round
//     trip; see clip_scale); decoupled weight decay p ← p(1 − lr·wd); moments rounded to their
//     storage type before they move the weight (so a resumed run takes the same step); the fp32
//     master updated and the 16-bit working copy written from it in the same pass.
//   sgd_update: SGD with momentum and optional Nesterov, likewise.
//   clip_scale: on the device, scale = inv_loss_scale · min(1, max_norm / (norm + 1e-6)) with
//     norm = sqrt(sum_squares) · inv_loss_scale.
//   adamw_update_device, sgd_update_device: the same updates with every per-step value in device
//     memory and a device skip flag, for a step captured once as a CUDA graph (see below).
// Not for: optimiser state allocation (the memory plan owns it).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "etude/backend/cuda/context.cuh"
#include "etude/config/optim.hpp"
#include "etude/backend/cuda/detail/common.cuh"
#include "etude/backend/cuda/dtype.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"

namespace etude::cuda {

namespace detail {

struct adamw_scalars {
  float step_size, bc2_sqrt, decay, w1, b2, w2, eps, grad_scale;
};

struct sgd_scalars {
  float lr, momentum, weight_decay, grad_scale;
  int nesterov, first;
};

// One element of AdamW on g = grad·scale. M master, G gradient, S moments, P working copy
// (nullable): device types.
template <class M, class G, class S, class P>
__device__ __forceinline__ void adamw_element(index_t i, M* p, const G* grad, S* m, S* v, P* working,
                                              const adamw_scalars& c, float scale) {
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

template <class M, class G, class S, class P, int Unroll>
__global__ void adamw_kernel(M* p, const G* grad, S* m, S* v, P* working, index_t n, adamw_scalars c,
                             const float* device_scale) {
  const float scale = device_scale != nullptr ? c.grad_scale * *device_scale : c.grad_scale;
  grid_stride<Unroll>(n, [&](index_t i) { adamw_element(i, p, grad, m, v, working, c, scale); });
}

// Every per-step value read from device memory: the optimiser's scalars (formed in double on the
// host, rounded to float here once, as the CPU rounds them), the gradient factor (clip coefficient
// / loss scale, from step_control) and a flag that skips the whole update.
template <class M, class G, class S, class P, int Unroll>
__global__ void adamw_device_kernel(M* p, const G* grad, S* m, S* v, P* working, index_t n,
                                    const optim::adamw::scalars* cp, const double* grad_scale, const int* skip) {
  if (*skip != 0) return;
  const optim::adamw::scalars d = *cp;
  const adamw_scalars c{static_cast<float>(d.step_size), static_cast<float>(d.bc2_sqrt), static_cast<float>(d.decay),
                        static_cast<float>(d.w1),        static_cast<float>(d.b2),       static_cast<float>(d.w2),
                        static_cast<float>(d.eps),       1.0f};
  const float scale = static_cast<float>(*grad_scale);
  grid_stride<Unroll>(n, [&](index_t i) { adamw_element(i, p, grad, m, v, working, c, scale); });
}

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
__global__ void sgd_kernel(M* p, const G* grad, S* buf, P* working, index_t n, float lr, float mu, float wd,
                           bool nesterov, bool first, float grad_scale) {
  grid_stride<Unroll>(n, [&](index_t i) { sgd_element(i, p, grad, buf, working, lr, mu, wd, nesterov, first, grad_scale); });
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

// The CPU backend's scalars, formed in double and rounded to float once.
inline adamw_scalars make_adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                                        long step, float grad_scale) {
  require(step >= 1, "adamw_update", "step counts updates from 1");
  const double t = static_cast<double>(step);
  return {static_cast<float>(lr / (1.0 - std::pow(beta1, t))), static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t))),
          static_cast<float>(1.0 - lr * weight_decay), static_cast<float>(1.0 - beta1), static_cast<float>(beta2),
          static_cast<float>(1.0 - beta2), static_cast<float>(eps), grad_scale};
}

}  // namespace detail

// AdamW at update `step` (from 1). M: master weights (float), G: gradients, S: moments, P: the
// working copy the forward reads (nullable). device_scale (nullable): an extra factor read on the
// device (the clip coefficient / loss scale from clip_scale).
template <class M, class G, class S, class P = M>
void adamw_update(M* p, const G* grad, S* m, S* v, index_t n, double lr, double beta1, double beta2, double eps,
                  double weight_decay, long step, double grad_scale, P* working = nullptr,
                  const float* device_scale = nullptr) {
  if (n <= 0) return;
  using tune = tuning<op::elementwise, M>;
  const auto c = detail::make_adamw_scalars(lr, beta1, beta2, eps, weight_decay, step, static_cast<float>(grad_scale));
  detail::adamw_kernel<device_t<M>, device_t<G>, device_t<S>, device_t<P>, tune::unroll>
      <<<detail::elementwise_grid<tune>(n), tune::threads, 0, current().stream()>>>(dev(p), dev(grad), dev(m), dev(v),
                                                                                 dev(working), n, c, device_scale);
  ETUDE_CUDA_CHECK_LAUNCH("adamw_kernel");
}

// g ← g·grad_scale + wd·p; buf ← μ buf + g (buf ← g on the first update); p ← p − lr·(nesterov ? g + μ buf : buf).
template <class M, class G, class S, class P = M>
void sgd_update(M* p, const G* grad, S* buf, index_t n, double lr, double momentum, double weight_decay, bool nesterov,
                bool first_step, double grad_scale, P* working = nullptr) {
  if (n <= 0) return;
  using tune = tuning<op::elementwise, M>;
  detail::sgd_kernel<device_t<M>, device_t<G>, device_t<S>, device_t<P>, tune::unroll>
      <<<detail::elementwise_grid<tune>(n), tune::threads, 0, current().stream()>>>(
          dev(p), dev(grad), dev(buf), dev(working), n, static_cast<float>(lr), static_cast<float>(momentum),
          static_cast<float>(weight_decay), nesterov, first_step, static_cast<float>(grad_scale));
  ETUDE_CUDA_CHECK_LAUNCH("sgd_kernel");
}

// ---- the step's forms: a step captured once as a CUDA graph and replayed --------------------------
// The optimiser's scalars live in device memory that the step refreshes before the update
// (config/optim.hpp forms them on the host, in double); the gradient factor and the skip flag are
// written on the device by step_control. All three pointers are device memory read when the
// kernel runs, so both backends take bit-identical steps from the same scalars.
template <class M, class G, class S, class P = M>
void adamw_update_device(M* p, const G* grad, S* m, S* v, index_t n, const optim::adamw::scalars* scalars,
                         const double* grad_scale, const int* skip, P* working = nullptr) {
  if (n <= 0) return;
  using tune = tuning<op::elementwise, M>;
  detail::adamw_device_kernel<device_t<M>, device_t<G>, device_t<S>, device_t<P>, tune::unroll>
      <<<detail::elementwise_grid<tune>(n), tune::threads, 0, current().stream()>>>(
          dev(p), dev(grad), dev(m), dev(v), dev(working), n, scalars, grad_scale, skip);
  ETUDE_CUDA_CHECK_LAUNCH("adamw_device_kernel");
}

template <class M, class G, class S, class P = M>
void sgd_update_device(M* p, const G* grad, S* buf, index_t n, const optim::sgd_scalars* scalars,
                       const double* grad_scale, const int* skip, P* working = nullptr) {
  if (n <= 0) return;
  using tune = tuning<op::elementwise, M>;
  detail::sgd_device_kernel<device_t<M>, device_t<G>, device_t<S>, device_t<P>, tune::unroll>
      <<<detail::elementwise_grid<tune>(n), tune::threads, 0, current().stream()>>>(
          dev(p), dev(grad), dev(buf), dev(working), n, scalars, grad_scale, skip);
  ETUDE_CUDA_CHECK_LAUNCH("sgd_device_kernel");
}

}  // namespace etude::cuda
