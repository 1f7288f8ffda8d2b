// The CPU backend: etude's numerical oracle and a real backend for machines without a GPU.
// OpenMP threads for elementwise and row-wise work, CBLAS sgemm (Debian's OpenBLAS built with
// OpenMP, so both share one thread pool) for matrix products. Deterministic: the same inputs and
// thread count give bit-identical results (reductions have a fixed order; no atomics).
//
// Storage types: every tensor argument may be float, double, etude::bf16 or etude::fp16
// independently (precision policies give each role its dtype). Arithmetic is float (double when
// the tensors are double): 16-bit values are widened on load and rounded to nearest even on
// store, so a mixed-precision step computes here exactly what its dtypes allow. Products of two
// bf16 operands run on the CPU's bf16 dot-product instructions through oneDNN where the program
// links etude::dnnl and the CPU has them (gemm.hpp); other products with 16-bit operands widen
// tiles into a fixed workspace and call sgemm on them.
//
// One file per op, each implementing its spec (ops/<op>.hpp, listed in ops/op_set.hpp); this
// struct gathers them into the op set. It declares no fusion: each fused form is its unfused
// composition, and the model takes the unfused path, which here rounds no more often.
#pragma once

#include "etude/backend/cpu/adamw.hpp"
#include "etude/backend/cpu/attention.hpp"
#include "etude/backend/cpu/condition.hpp"
#include "etude/backend/cpu/cross_attention.hpp"
#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/elementwise.hpp"
#include "etude/backend/cpu/ema.hpp"
#include "etude/backend/cpu/embedding.hpp"
#include "etude/backend/cpu/gemm.hpp"
#include "etude/backend/cpu/kv_cache.hpp"
#include "etude/backend/cpu/layernorm.hpp"
#include "etude/backend/cpu/reduce.hpp"
#include "etude/backend/cpu/sgd.hpp"
#include "etude/backend/cpu/softmax_xent.hpp"
#include "etude/backend/cpu/step_control.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu : cpu_gemm,
             cpu_elementwise,
             cpu_embedding,
             cpu_layernorm,
             cpu_attention,
             cpu_cross_attention,
             cpu_condition,
             cpu_kv_cache,
             cpu_softmax_xent,
             cpu_reduce,
             cpu_adamw,
             cpu_sgd,
             cpu_ema,
             cpu_step_control {
  static constexpr const char* name = "cpu";
  // The training state and step buffers are host memory (what a data-parallel communicator on the
  // host, MPI, exchanges directly; the memory plan counts its staging).
  static constexpr bool host_memory = true;
  static int threads() { return cpu_detail::threads(); }
  // Bytes the backend holds outside the trainer's buffers (a caching allocator's reserve, a
  // library handle's workspace): none on the CPU.
  static constexpr index_t reserve_bytes = 0;
  // GELU and its backward as epilogues of the bf16 products (cpu_gemm::gemm_gelu, gemm_gelu_bwd)
  static constexpr bool fuses_gemm_gelu = true;
  static constexpr bool fuses_residual_layernorm = false;
};

}  // namespace etude::backend
