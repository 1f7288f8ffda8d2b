// The CUDA backend: etude's op set (ops/op_set.hpp, one spec per op) on one GPU, one file per op
// (backend/cuda/<op>.cuh) gathered here under the spec's names, argument order and semantics (what
// accumulates with +=, what is in place), so `transformer<Model, backend::cuda, T>` can be
// instantiated in a user's .cu file. Every op runs on the calling thread's current context
// (context.cuh: `cuda::context ctx; cuda::scope s(ctx);`), takes device pointers and returns
// without synchronising, except all_finite, which returns its answer to the host.
// Storage types: float, etude::bf16, etude::fp16 (compute in float); LayerNorm statistics, the
// attention and cross-attention log-sum-exp and the condition mask are float whatever the storage
// type. Conditioned models' ops (ops/condition.hpp, ops/cross_attention.hpp) come from the bases
// cuda_condition (condition.cuh) and cuda_cross_attention (cross_attention.cuh).
// Differences from backend::cpu, all deliberate:
//   - attention_scratch() and cross_attention_scratch() are 0: the kernels need no scratch beyond
//     the context's;
//   - it declares both fusions: residual_layernorm_fwd reads x and r once and writes x_mid and y in
//     one pass; gemm_gelu is today a product followed by a row-wise exact-erf GELU pass (cuBLASLt's
//     GELU epilogue is the tanh approximation, which the model, AudioCraft's exact erf, cannot
//     use), declared so that a custom epilogue lands without touching the model;
//   - attention_bwd takes the row terms dO·O from the forward's output instead of recomputing them;
//   - gemm takes operands of one storage type (C: that type or float) and ignores the workspace
//     argument (cuBLASLt's workspace belongs to the context).
// Names: the op set is the struct etude::backend::cuda; the machinery under it (context, scope,
// buffers, the tuning trait, the free-function ops) lives in namespace etude::cuda, which a struct
// of the same name could not share; the struct re-exports what a user names.
// Not for: running the training step (graph capture, arena, input slots: backend/cuda/executor.hpp).
#pragma once

#include <type_traits>

#include "etude/backend/cuda/attention.cuh"
#include "etude/backend/cuda/condition.cuh"
#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/cross_attention.cuh"
#include "etude/backend/cuda/elementwise.cuh"
#include "etude/backend/cuda/embedding.cuh"
#include "etude/backend/cuda/gemm.cuh"
#include "etude/backend/cuda/kv_cache.cuh"
#include "etude/backend/cuda/layernorm.cuh"
#include "etude/backend/cuda/adamw.cuh"
#include "etude/backend/cuda/sgd.cuh"
#include "etude/backend/cuda/reduce.cuh"
#include "etude/backend/cuda/softmax_xent.cuh"
#include "etude/backend/cuda/step_control.cuh"
#include "etude/backend/cuda/tuning.cuh"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cuda : cuda_condition, cuda_cross_attention {
  static constexpr const char* name = "cuda";

  // What a training configuration must satisfy to run here; etude::trainer asks at compile time.
  template <class Config>
  static constexpr bool accepts() {
    using policy = typename Config::precision;
    constexpr auto S = Config::model::shape;
    static_assert(std::is_same_v<typename policy::compute_t, float>,
                  "backend::cuda computes in float; use the fp32, bf16 or fp16 policy (precision::fp64 is the "
                  "CPU's gradient-check oracle)");
    static_assert(std::is_same_v<typename policy::param_t, typename policy::activation_t>,
                  "backend::cuda: cuBLASLt products take both operands in one storage type, so param_t and "
                  "activation_t must be the same (as in precision::fp32, bf16 and fp16)");
    static_assert(std::is_same_v<typename policy::grad_t, float> ||
                      std::is_same_v<typename policy::grad_t, typename policy::activation_t>,
                  "backend::cuda: weight gradients accumulate in float or in the activation type");
    static_assert(::etude::cuda::attention_head_dims::contains(S.head_dim()),
                  "backend::cuda: no attention kernel for this head dimension (shape.dim / shape.heads); "
                  "supported: etude::cuda::attention_head_dims (64, 128); change heads");
    static_assert(S.dim % 8 == 0, "backend::cuda: shape.dim must be a multiple of 8 (16-byte rows)");
    static_assert(sizeof(typename policy::activation_t) == 4 || (S.card % 8 == 0 && S.ffn() % 8 == 0),
                  "backend::cuda: with 16-bit activations shape.card must be a multiple of 8 (the logits' rows "
                  "must be 16-byte aligned for the tensor-core products)");
    return true;
  }

  using context = ::etude::cuda::context;
  using scope = ::etude::cuda::scope;
  template <class T>
  using device_buffer = ::etude::cuda::device_buffer<T>;
  template <class T>
  using pinned_buffer = ::etude::cuda::pinned_buffer<T>;
  // Read through here; specialise ::etude::cuda::tuning (an alias cannot be specialised).
  template <class Op, class T, int Key = 0, class Arch = ::etude::cuda::arch::target>
  using tuning = ::etude::cuda::tuning<Op, T, Key, Arch>;

  // ---- matrix products ------------------------------------------------------------------------------
  // Bytes of gemm workspace the caller must pass (none: cuBLASLt's lives in the context) and bytes
  // the backend holds outside the trainer's buffers (the context's cuBLASLt workspace).
  template <class Policy>
  static constexpr index_t gemm_workspace_bytes() {
    return 0;
  }
  static constexpr index_t reserve_bytes = static_cast<index_t>(::etude::cuda::context::default_workspace_bytes);

  template <class TA, class TB, class TC>
  static void gemm(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, double alpha, const TA* a, index_t lda,
                   const TB* b, index_t ldb, double beta, TC* c, index_t ldc, float* /*workspace*/ = nullptr) {
    ::etude::cuda::gemm(trans_a, trans_b, m, n, k, static_cast<float>(alpha), a, lda, b, ldb, static_cast<float>(beta),
                        c, ldc);
  }
  // pre(m, n) = op(A)·op(B); act = GELU(pre) (exact erf), both with leading dimension ldc.
  static constexpr bool fuses_gemm_gelu = true;
  template <class TA, class TB, class TC>
  static void gemm_gelu(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, const TA* a, index_t lda,
                        const TB* b, index_t ldb, TC* pre, TC* act, index_t ldc, float* /*workspace*/ = nullptr) {
    ::etude::cuda::gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, pre, ldc);
    ::etude::cuda::gelu_rows(act, pre, m, n, ldc);
  }
  // dy(m, n) = op(A)·op(B), then dy = dy·GELU'(pre), both with leading dimension ldc: the product,
  // then the elementwise kernel (over the whole matrix when it is dense, else row by row).
  template <class TA, class TB, class TC>
  static void gemm_gelu_bwd(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, const TA* a, index_t lda,
                            const TB* b, index_t ldb, TC* dy, const TC* pre, index_t ldc,
                            float* /*workspace*/ = nullptr) {
    ::etude::cuda::gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, dy, ldc);
    if (ldc == n) {
      ::etude::cuda::gelu_bwd(dy, pre, m * n);
    } else {
      for (index_t r = 0; r < m; ++r) ::etude::cuda::gelu_bwd(dy + r * ldc, pre + r * ldc, n);
    }
  }

  // ---- elementwise ------------------------------------------------------------------------------------
  template <class D, class S>
  static void copy(D* dst, const S* src, index_t n) {
    ::etude::cuda::copy(dst, src, n);
  }
  template <class T>
  static void fill_zero(T* dst, index_t n) {
    ::etude::cuda::fill_zero(dst, n);
  }
  template <class T>
  static void accumulate(T* dst, const T* src, index_t n) {
    ::etude::cuda::accumulate(dst, src, n);
  }
  template <class T>
  static void sinusoid(T* out, index_t steps, index_t dim) {
    ::etude::cuda::sinusoid(out, steps, dim);
  }

  // ---- embeddings -----------------------------------------------------------------------------------
  // tables / dtables: host arrays of device pointers.
  template <class X, class W, class P>
  static void embedding_fwd(X* x, const token_t* seq, const W* const* tables, const P* pos, index_t batch,
                            int codebooks, index_t steps, index_t dim) {
    ::etude::cuda::embedding_fwd(x, seq, tables, pos, batch, codebooks, steps, dim);
  }
  template <class G, class X>
  static void embedding_bwd(G* const* dtables, const X* dx, const token_t* seq, index_t batch, int codebooks,
                            index_t steps, index_t dim) {
    ::etude::cuda::embedding_bwd(dtables, dx, seq, batch, codebooks, steps, dim);
  }

  // ---- LayerNorm (statistics in float) --------------------------------------------------------------------
  template <class Y, class X, class W>
  static void layernorm_fwd(Y* y, float* mean, float* rstd, const X* x, const W* gamma, const W* beta, index_t rows,
                            index_t dim) {
    ::etude::cuda::layernorm_fwd(y, mean, rstd, x, gamma, beta, rows, dim);
  }
  static constexpr bool fuses_residual_layernorm = true;
  template <class Y, class X, class W>
  static void residual_layernorm_fwd(X* x_mid, Y* y, float* mean, float* rstd, const X* x, const X* r, const W* gamma,
                                     const W* beta, index_t rows, index_t dim) {
    ::etude::cuda::residual_layernorm_fwd(x_mid, y, mean, rstd, x, r, gamma, beta, rows, dim);
  }
  template <class DX, class G, class DY, class X, class W>
  static void layernorm_bwd(DX* dx, G* dgamma, G* dbeta, const DY* dy, const X* x, const float* mean,
                            const float* rstd, const W* gamma, index_t rows, index_t dim) {
    ::etude::cuda::layernorm_bwd(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, dim);
  }

  // ---- attention (lse in float) -----------------------------------------------------------------------------
  static constexpr index_t attention_scratch(index_t /*steps*/, index_t /*head_dim*/ = 0, bool /*staged*/ = false,
                                             int /*threads*/ = 1) {
    return 0;
  }
  // HeadDim: the model's head dimension, one of ::etude::cuda::attention_head_dims.
  template <int HeadDim, class A>
  static void attention_fwd(A* att, float* lse, const A* qkv, index_t batch, index_t steps, int heads,
                            void* /*scratch*/ = nullptr, index_t /*scratch_size*/ = 0) {
    ::etude::cuda::attention_fwd<HeadDim>(att, lse, qkv, batch, steps, heads);
  }
  // att: the forward's output, whose rows give delta = dO·O directly (nullptr: recomputed).
  template <int HeadDim, class A>
  static void attention_bwd(A* dqkv, const A* datt, const A* att, const A* qkv, const float* lse, index_t batch,
                            index_t steps, int heads, void* /*scratch*/ = nullptr, index_t /*scratch_size*/ = 0) {
    ::etude::cuda::attention_bwd<HeadDim>(dqkv, datt, att, qkv, lse, batch, steps, heads);
  }

  // ---- key/value cache (decoding: generate/decoder.hpp) ------------------------------------------------
  template <class C, class A>
  static void kv_append(C* cache, const A* qkv, index_t batch, index_t n, index_t at, index_t max_steps, index_t dim) {
    ::etude::cuda::kv_append(cache, qkv, batch, n, at, max_steps, dim);
  }
  // The kernel keeps its partial sums in registers and shared memory: no scratch.
  static constexpr index_t cached_attention_scratch(index_t /*max_steps*/, int /*heads*/ = 0, int /*threads*/ = 1) {
    return 0;
  }
  template <int HeadDim, class A, class C>
  static void cached_attention(A* att, const A* qkv, const C* cache, index_t batch, index_t len, index_t max_steps,
                               int heads, void* /*scratch*/ = nullptr, index_t /*scratch_size*/ = 0) {
    ::etude::cuda::cached_attention<HeadDim>(att, qkv, cache, batch, len, max_steps, heads);
  }

  // ---- GELU ----------------------------------------------------------------------------------------------
  template <class T>
  static void gelu_fwd(T* y, const T* x, index_t n) {
    ::etude::cuda::gelu_fwd(y, x, n);
  }
  template <class T>
  static void gelu_bwd(T* dy, const T* x, index_t n) {
    ::etude::cuda::gelu_bwd(dy, x, n);
  }

  // ---- loss (weight and *loss in device memory: the step's scalars and results) ----------------------------
  template <class L>
  static void softmax_xent(L* logits, const token_t* target, index_t rows, index_t card, const float* weight,
                           double* loss) {
    ::etude::cuda::softmax_xent(logits, target, rows, card, weight, loss);
  }

  // ---- reductions -----------------------------------------------------------------------------------------
  template <class T>
  static void sum_squares(const T* x, index_t n, double* out) {
    ::etude::cuda::sum_squares(x, n, out);
  }
  template <class T>
  static bool all_finite(const T* x, index_t n) {
    return ::etude::cuda::all_finite(x, n);
  }

  // ---- optimisers (the step's forms: scalars, gradient factor, skip flag and decision in device memory) -------
  template <class M, class G, class S, class P = M>
  static void adamw_update(M* p, const G* grad, S* m, S* v, index_t n, const optim::adamw::scalars* scalars,
                           const double* grad_scale, const int* skip, P* working) {
    ::etude::cuda::adamw_update(p, grad, m, v, n, scalars, grad_scale, skip, working);
  }
  template <class M, class G, class S, class P = M>
  static void adamw_check(const M* p, const G* grad, const S* m, const S* v, index_t n,
                          const optim::adamw::scalars* scalars, step_decision* d, const P* working) {
    ::etude::cuda::adamw_check(p, grad, m, v, n, scalars, d, working);
  }
  template <class M, class G, class S, class P = M>
  static void sgd_update(M* p, const G* grad, S* buf, index_t n, const optim::sgd_scalars* scalars,
                         const double* grad_scale, const int* skip, P* working) {
    ::etude::cuda::sgd_update(p, grad, buf, n, scalars, grad_scale, skip, working);
  }
  template <class M, class G, class S, class P = M>
  static void sgd_check(const M* p, const G* grad, const S* buf, index_t n, const optim::sgd_scalars* scalars,
                        step_decision* d, const P* working) {
    ::etude::cuda::sgd_check(p, grad, buf, n, scalars, d, working);
  }

  // ---- step control (ops/step_control.hpp) ----------------------------------------------------------------
  static void step_control(const step_limits* in, const double* losses, int n, step_decision* out) {
    ::etude::cuda::step_control(in, losses, n, out);
  }
  static void share_refusal(const step_decision* d, index_t offset, std::int64_t* key) {
    ::etude::cuda::share_refusal(d, offset, key);
  }
  static void take_refusal(step_decision* d, const std::int64_t* key) { ::etude::cuda::take_refusal(d, key); }
  template <class T>
  static void clear_unless(T* x, index_t n, const int* keep) {
    ::etude::cuda::clear_unless(x, n, keep);
  }
};

}  // namespace etude::backend
