// Precision policies: which dtype each role of the training state uses. fp32 is the exact
// reference; mixed policies (bf16, fp16 with loss scaling) build on the same roles.
#pragma once

namespace etude::precision {

struct policy_tag {};

// Everything in float32: parameters, activations, gradients, optimiser states, communication.
struct fp32 : policy_tag {
  static constexpr const char* name = "fp32";
  using param_t = float;
  using activation_t = float;
  using grad_t = float;
  using state_t = float;
  static constexpr bool has_master = false;
  static constexpr bool loss_scaling = false;
  static constexpr bool uniform = true;  // one dtype for every role
};

// Everything in float64: not a training policy but the oracle for numerical gradient checks,
// where central differences need double precision to resolve 1e-6 relative errors.
struct fp64 : policy_tag {
  static constexpr const char* name = "fp64";
  using param_t = double;
  using activation_t = double;
  using grad_t = double;
  using state_t = double;
  static constexpr bool has_master = false;
  static constexpr bool loss_scaling = false;
  static constexpr bool uniform = true;
};

}  // namespace etude::precision
