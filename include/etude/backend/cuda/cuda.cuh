// The CUDA backend: etude's op set (ops/op_set.hpp, one spec per op) on one GPU. One file per op
// (backend/cuda/<op>.cuh) holds its kernels and a struct cuda_<op> of its entry points under the
// spec's names, argument order and semantics (what accumulates with +=, what is in place); this
// struct inherits them, as backend::cpu inherits cpu_<op>, so `transformer<Model, backend::cuda, T>`
// can be instantiated in a user's .cu file. Every op runs on the calling thread's current context
// (context.cuh: `cuda::context ctx; cuda::scope s(ctx);`), takes device pointers and returns
// without synchronising, except all_finite, which returns its answer to the host.
// Storage types: float, etude::bf16, etude::fp16 (compute in float); LayerNorm statistics, the
// attention and cross-attention log-sum-exp and the condition mask are float whatever the storage
// type.
// Differences from backend::cpu, all deliberate:
//   - attention_scratch(), cross_attention_scratch() and cached_attention_scratch() are 0: the
//     kernels need no scratch beyond the context's, and the scratch arguments are ignored;
//   - it declares both fusions: residual_layernorm_fwd reads x and r once and writes x_mid and y in
//     one pass; gemm_gelu is today a product followed by a row-wise exact-erf GELU pass (cuBLASLt's
//     GELU epilogue is the tanh approximation, which the model, AudioCraft's exact erf, cannot
//     use), declared so that a custom epilogue lands without touching the model;
//   - attention_bwd takes the row terms dO·O from the forward's output instead of recomputing them;
//   - gemm takes operands of one storage type (C: that type or float) and ignores the workspace
//     argument (cuBLASLt's workspace belongs to the context);
//   - sinusoid comes from cuda_elementwise (a pointwise kernel), not from the embedding struct.
// Names: the op set is the struct etude::backend::cuda. Each cuda_<op> is defined in namespace
// etude::cuda, beside the kernels and machinery (context, scope, buffers, the tuning trait) its
// bodies name, which a struct called cuda could not share, and is declared in etude::backend by a
// using-declaration; the struct re-exports what a user names.
// Not for: running the training step (graph capture, arena, input slots: backend/cuda/executor.hpp).
#pragma once

#include <type_traits>

#include "etude/backend/cuda/attention.cuh"
#include "etude/backend/cuda/condition.cuh"
#include "etude/backend/cuda/context.cuh"
#include "etude/backend/cuda/cross_attention.cuh"
#include "etude/backend/cuda/elementwise.cuh"
#include "etude/backend/cuda/ema.cuh"
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

struct cuda : cuda_gemm,
              cuda_elementwise,
              cuda_embedding,
              cuda_layernorm,
              cuda_attention,
              cuda_cross_attention,
              cuda_condition,
              cuda_kv_cache,
              cuda_softmax_xent,
              cuda_reduce,
              cuda_adamw,
              cuda_sgd,
              cuda_ema,
              cuda_step_control {
  static constexpr const char* name = "cuda";
  // Bytes the backend holds outside the trainer's buffers: the context's cuBLASLt workspace.
  static constexpr index_t reserve_bytes = static_cast<index_t>(::etude::cuda::context::default_workspace_bytes);

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
};

}  // namespace etude::backend
