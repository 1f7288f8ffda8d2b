// Spec of the matrix product and its GELU epilogue.
//
//   gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, workspace)
//       C(m, n) = alpha · op(A)(m, k) · op(B)(k, n) + beta · C: `=` with beta 0, `+=` with beta 1
//       (the residual stream and the weight gradients accumulate this way). Row-major; op(X) is X
//       or its transpose; summed in the compute type and rounded once into C's dtype.
//       workspace: gemm_workspace_bytes<Policy>() bytes the caller provides (0: none needed). It
//       serves one product at a time, except that threads of one parallel region (CPU) may hand their
//       concurrent products the same workspace: those use buffers of their own, and each gives the
//       same bits as that product called alone on one thread.
//   gemm_gelu(ta, tb, m, n, k, A, lda, B, ldb, pre, act, ldc)
//       pre(m, n) = op(A)·op(B), act = GELU(pre) (exact erf, as gelu_fwd); bit-identical to gemm
//       with alpha 1, beta 0 followed by gelu_fwd(act, pre).
//   gemm_gelu_bwd(ta, tb, m, n, k, A, lda, B, ldb, dy, pre, ldc)
//       dy(m, n) = op(A)·op(B), then dy = dy·GELU'(pre); bit-identical to gemm with alpha 1, beta 0
//       into dy followed by gelu_bwd(dy, pre): the FFN's backward through its down-projection.
// Fusion capability: a backend that declares `static constexpr bool fuses_gemm_gelu = true` has
// a gemm_gelu and a gemm_gelu_bwd worth calling instead of the two ops (an epilogue, one launch or
// one pass over memory fewer); the model asks at compile time (fuses_gemm_gelu<B>) and calls the
// pairs otherwise. Every backend implements the fused forms, where need be as the pairs.
#pragma once

#include <concepts>

#include "etude/core/types.hpp"

namespace etude::ops {

template <class B>
inline constexpr bool fuses_gemm_gelu = requires { requires B::fuses_gemm_gelu; };

template <class B, class Policy>
concept gemm_op = requires(const typename Policy::param_t* w, typename Policy::activation_t* a,
                           typename Policy::grad_t* g, index_t n, bool t, double s, float* ws) {
  { B::template gemm_workspace_bytes<Policy>() } -> std::convertible_to<index_t>;
  B::gemm(t, t, n, n, n, s, a, n, w, n, s, a, n, ws);  // activations from weights
  B::gemm(t, t, n, n, n, s, a, n, a, n, s, g, n, ws);  // weight gradients from activations
  B::gemm_gelu(t, t, n, n, n, a, n, w, n, a, a, n);
  B::gemm_gelu_bwd(t, t, n, n, n, a, n, w, n, a, a, n);
};

}  // namespace etude::ops
