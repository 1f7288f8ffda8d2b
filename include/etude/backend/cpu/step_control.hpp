// The CPU's step control (spec: ops/step_control.hpp): the decision taken on the host, the
// gradients cleared unless it keeps them.
#pragma once

#include "etude/backend/cpu/elementwise.hpp"
#include "etude/core/types.hpp"
#include "etude/ops/step_control.hpp"

namespace etude::backend {

struct cpu_step_control {
  static void step_control(const step_limits* in, const double* losses, int n, step_decision* out) {
    decide_step(*in, losses, n, *out);
  }
  static void share_refusal(const step_decision* d, index_t offset, std::int64_t* key) { *key = shared_refusal(*d, offset); }
  static void take_refusal(step_decision* d, const std::int64_t* key) { agree_refusal(*d, *key); }
  template <class T>
  static void clear_unless(T* x, index_t n, const int* keep) {
    if (*keep == 0) cpu_elementwise::fill_zero(x, n);
  }
};

}  // namespace etude::backend
