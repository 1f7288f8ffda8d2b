// Precision policies: which dtype each role of the training state uses. fp32 is the exact
// reference; mixed policies (bf16, fp16 with loss scaling) build on the same roles.
#pragma once

namespace etude::precision {

struct policy_tag {};

// A policy with one dtype for every role: parameters, activations, gradients, optimiser states
// and communication.
template <class T>
struct uniform_policy : policy_tag {
  using param_t = T;
  using activation_t = T;
  using grad_t = T;
  using state_t = T;
  static constexpr bool has_master = false;
  static constexpr bool loss_scaling = false;
  static constexpr bool uniform = true;
};

// Everything in float32: the exact training policy.
struct fp32 : uniform_policy<float> {
  static constexpr const char* name = "fp32";
};

// Everything in float64: not a training policy but the oracle for numerical gradient checks,
// where central differences need double precision to resolve 1e-6 relative errors.
struct fp64 : uniform_policy<double> {
  static constexpr const char* name = "fp64";
};

}  // namespace etude::precision
