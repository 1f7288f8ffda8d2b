// Spec of LayerNorm over rows of D values: eps 1e-5, biased variance (PyTorch's nn.LayerNorm).
//
//   layernorm_fwd(y, mean, rstd, x, gamma, beta, rows, D)
//       y = (x − mean)·rstd·gamma + beta (=); mean, rstd (rows) in the compute type, kept for the
//       backward.
//   layernorm_bwd(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, D)
//       dx += LayerNorm'(dy) (the residual stream's gradient accumulates); dgamma += Σ_rows dy·x̂,
//       dbeta += Σ_rows dy, deterministic.
//   residual_layernorm_fwd(x_mid, y, mean, rstd, x, r, gamma, beta, rows, D)
//       x_mid = x + r (rounded to x's dtype), then layernorm_fwd(y, mean, rstd, x_mid, ...).
// Fusion capability: a backend that declares `static constexpr bool fuses_residual_layernorm =
// true` reads x and r once and writes x_mid and y in one pass; the model then writes the
// attention's output projection into scratch (beta 0) and calls it. Otherwise the model keeps the
// residual in the product (copy x to x_mid, gemm with beta 1) and calls layernorm_fwd, which on
// the CPU rounds once instead of twice. Every backend implements the fused form (the CPU as an add
// and layernorm_fwd).
#pragma once

#include <concepts>

#include "etude/core/types.hpp"

namespace etude::ops {

template <class B>
inline constexpr bool fuses_residual_layernorm = requires { requires B::fuses_residual_layernorm; };

template <class B, class Policy>
concept layernorm_op = requires(typename Policy::activation_t* a, typename Policy::grad_t* g,
                                typename Policy::compute_t* f, const typename Policy::param_t* w, index_t n) {
  B::layernorm_fwd(a, f, f, a, w, w, n, n);
  B::layernorm_bwd(a, g, g, a, a, f, f, w, n, n);
  B::residual_layernorm_fwd(a, a, f, f, a, a, w, w, n, n);
};

}  // namespace etude::ops
