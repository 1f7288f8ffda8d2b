// The sizes a GPU backend adds to a memory plan, without the backend: `backend::device_plan` has
// the planning trait train/memory_plan.hpp reads from a backend (attention_scratch,
// gemm_workspace_bytes<Policy>, reserve_bytes) and nothing else, so
//
//   constexpr auto plan = etude::plan_memory<cfg, etude::backend::device_plan>(b, frames);
//
// is the plan of a GPU trainer, computed by g++ on a machine without CUDA (the will_it_fit
// planner, static_asserts against config/hardware.hpp's devices). The CUDA backend
// (backend/cuda/) exposes the same three numbers: its attention kernels keep no scratch
// (cuda.cuh), its products need no widening workspace, and its context holds the cuBLASLt
// workspace (context.cuh, default_workspace_bytes). Change them here and there together.
// Not for: running anything (no ops), or the CUDA runtime's own memory, which lies outside the
// plan (config/hardware.hpp, runtime_reserve).
#pragma once

#include "etude/core/types.hpp"

namespace etude::backend {

struct device_plan {
  static constexpr const char* name = "device plan";

  // Flash attention needs no scratch in global memory: the score tiles live in shared memory,
  // and backward recomputes the probabilities from the per-row log-sum-exp, which is an
  // activation slot already (layer_slot::att_lse); delta = dO·O goes into dq's own slot.
  static constexpr index_t attention_scratch(index_t /*steps*/, index_t /*head_dim*/, bool /*staged*/,
                                             int /*threads*/) {
    return 0;
  }
  // The same for cross-attention (backend/cuda/cross_attention.cuh): no scratch beyond its outputs.
  static constexpr index_t cross_attention_scratch(index_t /*steps*/, index_t /*positions*/, index_t /*head_dim*/,
                                                   bool /*staged*/, int /*threads*/) {
    return 0;
  }

  // Tensor cores read 16-bit operands directly, so no product widens its operands into a
  // workspace (the CPU backend does, three float tiles); fp32 products need none either.
  template <class Policy>
  static constexpr index_t gemm_workspace_bytes() {
    return 0;
  }

  // The cuBLASLt workspace: 32 MiB, what NVIDIA recommends for Hopper (and ample for Ampere).
  static constexpr index_t reserve_bytes = index_t{32} << 20;
};

}  // namespace etude::backend
