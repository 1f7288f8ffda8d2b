// The EMA of the weights on the CPU (spec: ops/ema.hpp): one parallel pass, (1 − w)·e + w·p in float.
#pragma once

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/core/types.hpp"
#include "etude/ops/ema.hpp"

namespace etude::backend {

struct cpu_ema {
  template <class M>
  static void ema_update(float* e, const M* p, index_t n, const ops::ema_scalars* sc, const int* skip) {
    if (*skip != 0 || sc->weight == 0.0) return;
    const float w = static_cast<float>(sc->weight), keep = static_cast<float>(1.0 - sc->weight);
#pragma omp parallel for simd schedule(static) if (n >= cpu_detail::parallel_min)
    for (index_t i = 0; i < n; ++i) e[i] = keep * e[i] + w * cpu_detail::convert<float>(p[i]);
  }
};

}  // namespace etude::backend
