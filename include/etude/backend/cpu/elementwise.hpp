// The CPU's elementwise ops (spec: ops/elementwise.hpp): conversions, zeroing, exact-erf GELU.
#pragma once

#include <cmath>
#include <cstring>
#include <type_traits>

#include "etude/backend/cpu/detail/common.hpp"
#include "etude/backend/cpu/detail/vmath.hpp"
#include "etude/core/types.hpp"

namespace etude::backend {

struct cpu_elementwise {
  template <class D, class S>
  static void copy(D* dst, const S* src, index_t n) {
#pragma omp parallel for simd schedule(static) if (n > cpu_detail::parallel_min)
    for (index_t i = 0; i < n; ++i) dst[i] = cpu_detail::cv<D>(src[i]);
  }
  template <class T>
  static void fill_zero(T* dst, index_t n) {
    if (n > 0) std::memset(static_cast<void*>(dst), 0, static_cast<std::size_t>(n) * sizeof(T));
  }
  template <class T>
  static void accumulate(T* dst, const T* src, index_t n) {
    using F = cpu_detail::compute_of<T>;
#pragma omp parallel for simd schedule(static) if (n > cpu_detail::parallel_min)
    for (index_t i = 0; i < n; ++i) dst[i] = cpu_detail::cv<T>(cpu_detail::cv<F>(dst[i]) + cpu_detail::cv<F>(src[i]));
  }

  template <class Y, class X>
  static void gelu_fwd(Y* y, const X* x, index_t n) {
    using F = cpu_detail::compute_of<X>;
#pragma omp parallel for simd schedule(static) if (n > cpu_detail::parallel_min)
    for (index_t i = 0; i < n; ++i) {
      const F v = cpu_detail::cv<F>(x[i]);
      if constexpr (std::is_same_v<F, float>) {
        y[i] = cpu_detail::cv<Y>(v * cpu_detail::normal_cdf(v, cpu_detail::gauss(v)));
      } else {
        y[i] = cpu_detail::cv<Y>(F(0.5) * v * std::erfc(-v * F(0.70710678118654752440)));
      }
    }
  }
  // dx = dy · gelu'(x), in place over dy. In float the density's e^(−x²/2) is also the factor of
  // Φ's tail, computed once.
  template <class DY, class X>
  static void gelu_bwd(DY* dy, const X* x, index_t n) {
    using F = cpu_detail::compute_of<X>;
    constexpr F inv_sqrt_2pi = F(0.398942280401432677940);
#pragma omp parallel for simd schedule(static) if (n > cpu_detail::parallel_min)
    for (index_t i = 0; i < n; ++i) {
      const F v = cpu_detail::cv<F>(x[i]);
      F cdf, pdf;
      if constexpr (std::is_same_v<F, float>) {
        const float g = cpu_detail::gauss(v);
        cdf = cpu_detail::normal_cdf(v, g);
        pdf = inv_sqrt_2pi * g;
      } else {
        cdf = F(0.5) * std::erfc(-v * F(0.70710678118654752440));
        pdf = inv_sqrt_2pi * std::exp(-F(0.5) * v * v);
      }
      dy[i] = cpu_detail::cv<DY>(cpu_detail::cv<F>(dy[i]) * (cdf + v * pdf));
    }
  }
};

}  // namespace etude::backend
