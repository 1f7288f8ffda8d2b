// LayerNorm on the CPU: the backward against central differences of the forward in double, its
// column sums for any thread count, the residual fusion against its unfused definition.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include <etude/etude.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

TEST_CASE("layernorm backward matches central differences", "[ops]") {
  const index_t rows = 3, dim = 6;
  auto x = random_vector(rows * dim, 1, 2.0), gamma = random_vector(dim, 2), beta = random_vector(dim, 3);
  const auto dy = random_vector(rows * dim, 4);
  std::vector<double> y(rows * dim), mean(rows), rstd(rows);
  auto loss = [&] {
    cpu::layernorm_fwd(y.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(), rows, dim);
    return dot(y, dy);
  };
  loss();
  std::vector<double> dx(rows * dim, 0.0), dgamma(dim, 0.0), dbeta(dim, 0.0);
  cpu::layernorm_bwd(dx.data(), dgamma.data(), dbeta.data(), dy.data(), x.data(), mean.data(), rstd.data(),
                     gamma.data(), rows, dim);
  check_gradient(x, dx, loss, "dx");
  check_gradient(gamma, dgamma, loss, "dgamma");
  check_gradient(beta, dbeta, loss, "dbeta");
}

// The backward's column sums (dgamma, dbeta) are one chain of additions per column in row order,
// whoever owns the column: the same bits with one, two or three threads, for a width that is not
// whole chunks of 16, bf16 rows and float gradients already holding values.
TEST_CASE("layernorm backward: the same column sums for any thread count", "[ops]") {
  using etude::bf16;
  const index_t rows = 77, dim = 250;
  const auto x0 = random_vector(rows * dim, 21, 2.0), dy0 = random_vector(rows * dim, 22);
  std::vector<bf16> x(x0.size()), dy(dy0.size()), y(x0.size());
  for (std::size_t i = 0; i < x0.size(); ++i) x[i] = bf16(float(x0[i])), dy[i] = bf16(float(dy0[i]));
  std::vector<float> gamma(dim, 1.25f), beta(dim, -0.5f), mean(rows), rstd(rows);
  cpu::layernorm_fwd(y.data(), mean.data(), rstd.data(), x.data(), gamma.data(), beta.data(), rows, dim);
  std::vector<std::vector<float>> sums;
  std::vector<std::vector<bf16>> dxs;
  const int before = omp_get_max_threads();
  for (const int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> dgamma(dim, 0.75f), dbeta(dim, -0.25f);
    std::vector<bf16> dx(x.size(), bf16(0.5f));
    cpu::layernorm_bwd(dx.data(), dgamma.data(), dbeta.data(), dy.data(), x.data(), mean.data(), rstd.data(),
                       gamma.data(), rows, dim);
    dgamma.insert(dgamma.end(), dbeta.begin(), dbeta.end());
    sums.push_back(dgamma);
    dxs.push_back(dx);
  }
  omp_set_num_threads(before);
  for (std::size_t t = 1; t < sums.size(); ++t) {
    INFO("threads " << t + 1 << " against one");
    CHECK(std::memcmp(sums[t].data(), sums[0].data(), sums[0].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(dxs[t].data(), dxs[0].data(), dxs[0].size() * sizeof(bf16)) == 0);
  }
}

// residual_layernorm_fwd is defined as x_mid = x + r rounded to x's dtype, then layernorm_fwd:
// the CPU's form must be exactly that, in double and with bf16 activations.
template <class X>
void check_residual_fusion() {
  const index_t rows = 5, dim = 24;
  const auto xd = random_vector(rows * dim, 21, 3.0), rd = random_vector(rows * dim, 22);
  const auto gd = random_vector(dim, 23), bd = random_vector(dim, 24);
  using F = std::conditional_t<std::is_same_v<X, double>, double, float>;
  std::vector<X> x(xd.size()), r(rd.size());
  std::vector<F> gamma(gd.begin(), gd.end()), beta(bd.begin(), bd.end());
  for (std::size_t i = 0; i < xd.size(); ++i) x[i] = X(static_cast<F>(xd[i])), r[i] = X(static_cast<F>(rd[i]));
  std::vector<X> mid(x.size()), y(x.size()), want_mid(x.size()), want_y(x.size());
  std::vector<F> mean(rows), rstd(rows), want_mean(rows), want_rstd(rows);
  cpu::residual_layernorm_fwd(mid.data(), y.data(), mean.data(), rstd.data(), x.data(), r.data(), gamma.data(),
                              beta.data(), rows, dim);
  for (std::size_t i = 0; i < x.size(); ++i) want_mid[i] = X(static_cast<F>(x[i]) + static_cast<F>(r[i]));
  cpu::layernorm_fwd(want_y.data(), want_mean.data(), want_rstd.data(), want_mid.data(), gamma.data(), beta.data(),
                     rows, dim);
  auto bits = [](const auto& v) {
    std::vector<unsigned char> b(v.size() * sizeof(v[0]));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  CHECK(bits(mid) == bits(want_mid));
  CHECK(bits(y) == bits(want_y));
  CHECK(bits(mean) == bits(want_mean));
  CHECK(bits(rstd) == bits(want_rstd));
}

TEST_CASE("residual_layernorm_fwd is the add, rounded, then layernorm_fwd", "[ops]") {
  check_residual_fusion<double>();
  check_residual_fusion<float>();
  check_residual_fusion<etude::bf16>();
}

namespace {
struct declares_fusion {
  static constexpr bool fuses_residual_layernorm = true;
};
struct declines_fusion {
  static constexpr bool fuses_residual_layernorm = false;
};
}  // namespace

TEST_CASE("the residual fusion is a capability a backend declares", "[ops]") {
  STATIC_REQUIRE_FALSE(etude::ops::fuses_residual_layernorm<cpu>);
  STATIC_REQUIRE(etude::ops::fuses_residual_layernorm<declares_fusion>);
  STATIC_REQUIRE_FALSE(etude::ops::fuses_residual_layernorm<declines_fusion>);
  STATIC_REQUIRE_FALSE(etude::ops::fuses_residual_layernorm<int>);
}
