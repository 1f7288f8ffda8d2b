// The backend op set: what a backend must supply for the model, loss and optimisers, which are
// written once against it (model/transformer.hpp, train/trainer.hpp). This is the specification
// ("what"); backend/cpu/cpu.hpp and the CUDA backend are implementations ("how"). All tensors
// are row-major; B·S rows are token positions; T is the arithmetic type of the pass.
//
//   gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)
//       C(m, n) = alpha · op(A)(m, k) · op(B)(k, n) + beta · C
//   copy(dst, src, n), fill_zero(dst, n)
//   sinusoid(out (S, D), S, D)                   AudioCraft's positions, cos half first
//   embedding_fwd(x (B·S, D), seq (B, K, S), tables[K] (C+1, D), pos (S, D), B, K, S, D)
//   embedding_bwd(dtables[K], dx (B·S, D), seq, B, K, S, D)          deterministic, no atomics
//   layernorm_fwd(y, mean, rstd, x, gamma, beta, rows, D)           eps 1e-5, biased variance
//   layernorm_bwd(dx +=, dgamma +=, dbeta +=, dy, x, mean, rstd, gamma, rows, D)
//   attention_scratch(S) -> floats of scratch the attention ops need
//   attention_fwd(att (B·S, D), lse (B·S, H), qkv (B·S, 3D), B, S, H, hd, scratch, size)   causal
//   attention_bwd(dqkv (B·S, 3D), datt, qkv, lse, B, S, H, hd, scratch, size)
//   gelu_fwd(y, x, n), gelu_bwd(dy in place → dx, x, n)              exact erf GELU
//   softmax_xent(logits (rows, C) in place → weight·(softmax − onehot), target (rows) or −1,
//                rows, C, weight) -> summed cross-entropy (double)
//   sum_squares(x, n) -> double, all_finite(x, n) -> bool           deterministic reductions
//   adamw_update(p, g, m, v, n, lr, beta1, beta2, eps, wd, step, grad_scale)
//   sgd_update(p, g, buf, n, lr, momentum, wd, nesterov, first_step, grad_scale)
#pragma once

#include <concepts>

#include "etude/core/types.hpp"

namespace etude {

template <class B, class T>
concept backend_op_set = requires(T* p, const T* c, const T* const* tables, T* const* dtables, const token_t* tok,
                                  index_t n, int k, bool flag, T s, double d, long step) {
  { B::name } -> std::convertible_to<const char*>;
  B::gemm(flag, flag, n, n, n, s, c, n, c, n, s, p, n);
  B::copy(p, c, n);
  B::fill_zero(p, n);
  B::sinusoid(p, n, n);
  B::embedding_fwd(p, tok, tables, c, n, k, n, n);
  B::embedding_bwd(dtables, c, tok, n, k, n, n);
  B::layernorm_fwd(p, p, p, c, c, c, n, n);
  B::layernorm_bwd(p, p, p, c, c, c, c, c, n, n);
  { B::attention_scratch(n) } -> std::convertible_to<index_t>;
  B::attention_fwd(p, p, c, n, n, k, n, p, n);
  B::attention_bwd(p, c, c, c, n, n, k, n, p, n);
  B::gelu_fwd(p, c, n);
  B::gelu_bwd(p, c, n);
  { B::softmax_xent(p, tok, n, n, s) } -> std::convertible_to<double>;
  { B::sum_squares(c, n) } -> std::convertible_to<double>;
  { B::all_finite(c, n) } -> std::convertible_to<bool>;
  B::adamw_update(p, c, p, p, n, d, d, d, d, d, step, s);
  B::sgd_update(p, c, p, n, d, d, d, flag, flag, s);
};

}  // namespace etude
