// What the op tests share: seeded random inputs, central differences, and the fp64 forms every
// backend's op is checked against.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include <etude/core/rng.hpp>

namespace etude::test::ops {

inline std::vector<double> random_vector(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  etude::rng r(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = r.uniform(-scale, scale);
  return v;
}

// Checks grad (analytic d loss / d x) against central differences of loss at every element.
// With a stride, every stride-th element (the forward is re-run twice per element).
inline void check_gradient(std::vector<double>& x, const std::vector<double>& grad, const std::function<double()>& loss,
                           const char* what, std::size_t stride = 1) {
  INFO(what);
  for (std::size_t i = 0; i < x.size(); i += stride) {
    const double keep = x[i], h = 1e-6 * std::max(1.0, std::abs(keep));
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    const double numeric = (up - down) / (2 * h);
    INFO("element " << i);
    CHECK(grad[i] == Approx(numeric).epsilon(1e-6).margin(1e-8));
  }
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// C(m, n) = alpha·op(A)·op(B) + beta·C, row-major, summed in double: the products' oracle.
inline void naive_gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, double alpha,
                       const std::vector<double>& a, std::size_t lda, const std::vector<double>& b, std::size_t ldb,
                       double beta, std::vector<double>& c, std::size_t ldc) {
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::size_t p = 0; p < k; ++p) s += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = alpha * s + beta * c[i * ldc + j];
    }
}

}  // namespace etude::test::ops
