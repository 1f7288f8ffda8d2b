// The run-time face an op test sees of a backend (tests/ops/<op>.cpp, written once): host vectors
// of float holding values of a storage dtype chosen at run time, results widened back to float.
// The CPU's runs are tests/ops/cpu_runs.hpp; CUDA's are tests/gpu/ops_device.hpp (compiled by nvcc,
// or by the host compiler against the simulator). Host code nvcc can read: no Catch2, no backend.
// Not for what only one backend has (graph capture, streams, thread counts): those tests stay with it.
#pragma once

#include <vector>

#include "etude/core/types.hpp"

// Types only, in a namespace of their own: argument-dependent lookup on a dtype finds no function,
// so a test file's own helpers of the same name (round_to, uniform) are not made ambiguous.
namespace etude::test::runs {

enum class dtype { f32, bf16, f16 };
using vec = std::vector<float>;
using tokens = std::vector<token_t>;

struct ln_fwd_out {
  vec y, mean, rstd, x_mid;
};

// attention_fwd's output and its log-sum-exp per row and head.
struct attn_fwd_out {
  vec att, lse;
};

// The optimisers' checks: the decision's `refused` after the check of a decision that runs (skip 0)
// or skips (skip 1), and whether every input came back unchanged.
struct check_result {
  index_t refused;
  int skip, status;
  bool unchanged;
};

}  // namespace etude::test::runs
