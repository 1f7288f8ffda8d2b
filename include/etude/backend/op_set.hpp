// The backend op set: what a backend must supply for the model, loss and optimisers, which are
// written once against it (model/transformer.hpp, train/trainer.hpp). This is the specification
// ("what"); backend/cpu/cpu.hpp and the CUDA backend are implementations ("how"). All tensors
// are row-major; B·S rows are token positions. Each tensor argument has its own storage dtype
// (float, double, bf16, fp16, as a precision policy assigns them); arithmetic is in the compute
// type (float, or double for the fp64 oracle); 16-bit results are rounded to nearest even.
// Scalars (alpha, beta, weight, lr, …) are passed as double.
//
//   gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, workspace)
//       C(m, n) = alpha · op(A)(m, k) · op(B)(k, n) + beta · C, summed in the compute type
//   copy(dst, src, n), fill_zero(dst, n)
//   sinusoid(out (S, D), S, D)                   AudioCraft's positions, cos half first
//   embedding_fwd(x (B·S, D), seq (B, K, S), tables[K] (C+1, D), pos (S, D), B, K, S, D)
//   embedding_bwd(dtables[K], dx (B·S, D), seq, B, K, S, D)          deterministic, no atomics
//   layernorm_fwd(y, mean, rstd, x, gamma, beta, rows, D)           eps 1e-5, biased variance
//   layernorm_bwd(dx +=, dgamma +=, dbeta +=, dy, x, mean, rstd, gamma, rows, D)
//   attention_scratch(S, hd, staged, threads) -> compute-type values the attention ops need
//   attention_fwd(att (B·S, D), lse (B·S, H), qkv (B·S, 3D), B, S, H, hd, scratch, size)   causal
//   attention_bwd(dqkv (B·S, 3D), datt, qkv, lse, B, S, H, hd, scratch, size)
//   gelu_fwd(y, x, n), gelu_bwd(dy in place → dx, x, n)              exact erf GELU
//   softmax_xent(logits (rows, C) in place → weight·(softmax − onehot), target (rows) or −1,
//                rows, C, const F* weight, double* loss)         *loss += summed cross-entropy
//   sum_squares(x, n, double* out), all_finite(x, n) -> bool       deterministic reductions
//   adamw_update(master, g, m, v, n, const adamw::scalars*, const double* grad_scale,
//                const int* skip, working copy)
//   sgd_update(master, g, buf, n, const sgd_scalars*, const double* grad_scale, const int* skip,
//              working copy)
//   step_control(const step_limits*, const double* losses, n, step_decision*)  (ops/step_control.hpp)
//   clear_unless(x, n, const int* keep)
// Pointer scalars (weight, loss, grad_scale, skip, keep, the optimiser's scalars) live in the
// memory of the backend that runs the op, so one step body serves every backend and a GPU step
// can be captured once and replayed.
#pragma once

#include <concepts>

#include "etude/config/optim.hpp"
#include "etude/core/types.hpp"
#include "etude/ops/step_control.hpp"

namespace etude {

template <class B, class Policy>
concept backend_op_set = requires(typename Policy::param_t* w, typename Policy::activation_t* a,
                                  typename Policy::grad_t* g, typename Policy::master_t* m,
                                  typename Policy::state_t* st, typename Policy::compute_t* f,
                                  const typename Policy::param_t* const* tables, typename Policy::grad_t* const* dtables,
                                  const token_t* tok, index_t n, int k, bool flag, double d, float* ws,
                                  const optim::adamw::scalars* adam, const optim::sgd_scalars* sgd,
                                  const step_limits* limits, step_decision* decision, const int* flag_ptr) {
  { B::name } -> std::convertible_to<const char*>;
  B::gemm(flag, flag, n, n, n, d, a, n, w, n, d, a, n, ws);
  B::gemm(flag, flag, n, n, n, d, a, n, a, n, d, g, n, ws);
  B::copy(a, a, n);
  B::fill_zero(g, n);
  B::sinusoid(f, n, n);
  B::embedding_fwd(a, tok, tables, f, n, k, n, n);
  B::embedding_bwd(dtables, a, tok, n, k, n, n);
  B::layernorm_fwd(a, f, f, a, w, w, n, n);
  B::layernorm_bwd(a, g, g, a, a, f, f, w, n, n);
  B::attention_fwd(a, f, a, n, n, k, n, f, n);
  B::attention_bwd(a, a, a, f, n, n, k, n, f, n);
  B::gelu_fwd(a, a, n);
  B::gelu_bwd(a, a, n);
  B::softmax_xent(a, tok, n, n, f, &decision->sum_squares);
  B::sum_squares(g, n, &decision->sum_squares);
  { B::all_finite(g, n) } -> std::convertible_to<bool>;
  B::adamw_update(m, g, st, st, n, adam, &decision->grad_scale, flag_ptr, w);
  B::sgd_update(m, g, st, n, sgd, &decision->grad_scale, flag_ptr, w);
  B::step_control(limits, &decision->sum_squares, k, decision);
  B::clear_unless(g, n, flag_ptr);
};

}  // namespace etude
