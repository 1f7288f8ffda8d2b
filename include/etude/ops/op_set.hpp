// The op set: what a backend must supply for the model, the loss and the optimisers, which are
// written once against it (model/transformer.hpp, train/trainer.hpp). One spec per op says what
// each computes: shapes, `=` or `+=`, dtypes, preconditions, and the fused forms a backend may
// declare a capability for:
//   ops/gemm.hpp (gemm, gemm_gelu)          ops/elementwise.hpp (copy, fill_zero, gelu_fwd/bwd)
//   ops/embedding.hpp (sinusoid, embedding_fwd/bwd)
//   ops/layernorm.hpp (layernorm_fwd/bwd, residual_layernorm_fwd)
//   ops/attention.hpp (attention_scratch, attention_fwd/bwd)
//   ops/cross_attention.hpp, ops/condition.hpp (conditioned models only: condition_op_set)
//   ops/kv_cache.hpp (kv_append, cached_attention_scratch, cached_attention: decoding)
//   ops/softmax_xent.hpp    ops/reduce.hpp (sum_squares, all_finite)
//   ops/adamw.hpp, ops/sgd.hpp (the updates and their checks)   ops/ema.hpp (the weights' average)
//   ops/step_control.hpp (step_control, clear_unless)
// backend/cpu/<op>.hpp and backend/cuda/<op>.cuh implement them; backend/cpu/cpu.hpp and
// backend/cuda/cuda.cuh assemble the two op sets.
//
// Common to every op: tensors are row-major, B·S rows are token positions; each tensor argument
// has its own storage dtype (float, double, bf16, fp16, as a precision policy assigns them);
// arithmetic is in the compute type (float, or double for the fp64 oracle) and 16-bit results are
// rounded to nearest even. Pointer scalars (weight, loss, grad_scale, skip, keep, the optimiser's
// scalars) are memory of the backend that runs the op, so one step body serves every backend and
// a GPU step can be captured once and replayed. A backend also names itself (name) and says how
// many bytes it holds outside the trainer's buffers (reserve_bytes).
#pragma once

#include <concepts>

#include "etude/core/types.hpp"
#include "etude/ops/adamw.hpp"
#include "etude/ops/attention.hpp"
#include "etude/ops/condition.hpp"
#include "etude/ops/cross_attention.hpp"
#include "etude/ops/dropout.hpp"
#include "etude/ops/elementwise.hpp"
#include "etude/ops/ema.hpp"
#include "etude/ops/embedding.hpp"
#include "etude/ops/gemm.hpp"
#include "etude/ops/kv_cache.hpp"
#include "etude/ops/layernorm.hpp"
#include "etude/ops/reduce.hpp"
#include "etude/ops/sgd.hpp"
#include "etude/ops/softmax_xent.hpp"
#include "etude/ops/step_control.hpp"

namespace etude {

template <class B, class Policy>
concept backend_op_set =
    ops::gemm_op<B, Policy> && ops::elementwise_op<B, Policy> && ops::dropout_op<B, Policy> && ops::embedding_op<B, Policy> &&
    ops::layernorm_op<B, Policy> && ops::attention_op<B, Policy> && ops::kv_cache_op<B, Policy> && ops::softmax_xent_op<B, Policy> &&
    ops::reduce_op<B, Policy> && ops::adamw_op<B, Policy> && ops::sgd_op<B, Policy> && ops::ema_op<B, Policy> &&
    requires(const step_limits* limits, const double* losses, step_decision* decision, typename Policy::grad_t* g,
             const int* keep, index_t n, int k) {
      { B::name } -> std::convertible_to<const char*>;
      { B::reserve_bytes } -> std::convertible_to<index_t>;
      B::step_control(limits, losses, k, decision);
      B::clear_unless(g, n, keep);
    };

// What a conditioned model needs besides (config/conditions.hpp): the condition tensor's ops and
// cross-attention. Asked of a backend only when a model is conditioned.
template <class B, class Policy>
concept condition_op_set = ops::condition_op<B, Policy> && ops::cross_attention_op<B, Policy>;

}  // namespace etude
