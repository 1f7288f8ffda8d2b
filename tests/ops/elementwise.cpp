// The elementwise ops on the CPU: exact-erf GELU and its backward, and the vectorised exp and
// erf it uses against libm.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <etude/etude.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

TEST_CASE("GELU backward matches central differences", "[ops]") {
  auto x = random_vector(40, 8, 4.0);
  const auto dy = random_vector(40, 9);
  std::vector<double> y(40);
  auto loss = [&] {
    cpu::gelu_fwd(y.data(), x.data(), 40);
    return dot(y, dy);
  };
  std::vector<double> dx = dy;
  cpu::gelu_bwd(dx.data(), x.data(), 40);
  check_gradient(x, dx, loss, "dx");
  // exact erf GELU, not the tanh approximation
  const double v = 1.5;
  double out;
  cpu::gelu_fwd(&out, &v, 1);
  CHECK(out == Approx(0.5 * 1.5 * (1 + std::erf(1.5 / std::sqrt(2.0)))).epsilon(1e-15));
}

TEST_CASE("vectorised exp is within 2 ulp of libm", "[ops]") {
  for (float x = -87.0f; x <= 88.0f; x += 0.001953125f) {
    const float ours = etude::backend::cpu_detail::exp_cody_waite(x);
    const double ref = std::exp(static_cast<double>(x));
    INFO("x = " << x);
    REQUIRE(std::abs(ours - ref) <= 2.5 * std::abs(ref) * 5.96e-8);
  }
  CHECK(etude::backend::cpu_detail::exp_cody_waite(-110.0f) == 0.0f);
  // subnormal results keep their magnitude
  CHECK(etude::backend::cpu_detail::exp_cody_waite(-95.0f) == Approx(std::exp(-95.0)).epsilon(1e-3));
  CHECK(std::isinf(etude::backend::cpu_detail::exp_cody_waite(100.0f)));
  CHECK(etude::backend::cpu_detail::exp_cody_waite(0.0f) == 1.0f);
  CHECK(std::isnan(etude::backend::cpu_detail::exp_cody_waite(std::nanf(""))));
}

TEST_CASE("vectorised erf is within 3 ulp of libm", "[ops]") {
  for (float x = -5.0f; x <= 5.0f; x += 0.0001220703125f) {
    const float ours = etude::backend::cpu_detail::erf_poly(x);
    const double ref = std::erf(static_cast<double>(x));
    const double ulp = std::nextafter(static_cast<float>(std::abs(ref)), 2.0f) - static_cast<float>(std::abs(ref));
    INFO("x = " << x);
    REQUIRE(std::abs(ours - ref) <= 3.0 * ulp + 1e-45);
  }
  CHECK(etude::backend::cpu_detail::erf_poly(0.0f) == 0.0f);
  CHECK(std::isnan(etude::backend::cpu_detail::erf_poly(std::nanf(""))));
}

TEST_CASE("GELU backward in float is the exact derivative within a few roundings", "[ops]") {
  // float and bf16 inputs over the range a step sees, against the derivative in double
  std::vector<float> x, dy;
  for (float v = -7.0f; v <= 7.0f; v += 0.0009765625f) {
    x.push_back(v);
    dy.push_back(1.0f - v / 16.0f);
  }
  std::vector<float> dx = dy;
  cpu::gelu_bwd(dx.data(), x.data(), index_t(x.size()));
  std::vector<etude::bf16> xb(x.size()), dxb(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    xb[i] = etude::bf16(x[i]);
    dxb[i] = etude::bf16(dy[i]);
  }
  cpu::gelu_bwd(dxb.data(), xb.data(), index_t(x.size()));
  double worst = 0.0, worst_bf16 = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto derivative = [](double v) {
      return 0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) + v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
    };
    const double v = x[i], vb = static_cast<float>(xb[i]);
    // the two terms' magnitudes bound the rounding: cdf and |x|·pdf, each within a few float ulp
    const double scale = std::abs(dy[i]) * (1.0 + std::abs(v) * std::exp(-0.5 * v * v));
    worst = std::max(worst, std::abs(dx[i] - dy[i] * derivative(v)) / (scale * 0x1p-24));
    const double got = static_cast<float>(dxb[i]), want = static_cast<float>(etude::bf16(dy[i])) * derivative(vb);
    worst_bf16 = std::max(worst_bf16, std::abs(got - want) / (std::abs(want) * 0x1p-8 + scale * 0x1p-22));
  }
  INFO("float: " << worst << " float roundings; bf16: " << worst_bf16 << " of its bound");
  CHECK(worst <= 16.0);
  CHECK(worst_bf16 <= 1.0);
}
