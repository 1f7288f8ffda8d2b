// LayerNorm, written once for every backend (the category file ETUDE_OPS_CATEGORY names it:
// tests/ops/category_cpu.hpp in test_ops, category_cuda.hpp in test_gpu_ops and test_sim_ops):
// forward, fused residual and backward in f32, bf16 and fp16 against the fp64 oracle, within bounds
// from the dtype, and two runs bit-identical. On the CPU only: the fp64 backward against central
// differences, its column sums for any thread count, the residual fusion against its unfused
// definition bit for bit, the fusion as a declared capability. CUDA's own question (a dim that is no
// multiple of its vector width) is in tests/gpu/ops.cpp.
#include ETUDE_OPS_CATEGORY

#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>
#include <etude/ops/layernorm.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

// Bounds (u the storage dtype's unit roundoff): a value computed in float from identical inputs and
// rounded once to the storage type is within u·|y| of the exact result, plus the float computation's
// own error; sums in another order than the oracle's differ by at most 2·n·2^-24·Σ|terms|.
TEST_CASE(TEST_BACKEND_NAME ": layernorm forward, fused residual and backward within the dtype's bound of fp64",
          "[ops][layernorm]") {
  const index_t rows = 77, dim = 96;  // rows not a multiple of a CUDA block's rows
  const auto n = static_cast<std::size_t>(rows * dim), nd = static_cast<std::size_t>(dim);
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16}) {
    const double u = unit_roundoff(t);
    const vec x = uniform(n, -2, 3, 50, t);
    const vec gamma = uniform(nd, 0.5, 1.5, 51, t), beta = uniform(nd, -0.5, 0.5, 52, t);
    // the oracle on the same values
    const auto xd = as_double(x), gd = as_double(gamma), bd = as_double(beta);
    std::vector<double> yd(n), md(static_cast<std::size_t>(rows)), rd(md.size());
    cpu::layernorm_fwd(yd.data(), md.data(), rd.data(), xd.data(), gd.data(), bd.data(), rows, dim);
    const vec mean = as_float(md), rstd = as_float(rd);
    const auto out = TEST_BACKEND::layernorm_fwd(t, x, {}, gamma, beta, rows, dim);
    // statistics in double, rounded to float once
    check_close(out.mean, mean, 0x1p-23, 1e-7, std::string("layernorm mean ") + name(t));
    check_close(out.rstd, rstd, 0x1p-23, 0.0, std::string("layernorm rstd ") + name(t));
    // y = (x − m)·rs·γ + β in float (a few roundings, |x̂γ| + |β| <= ~4), then one rounding
    check_close(out.y, as_float(yd), u + 1e-6, 1e-5, std::string("layernorm y ") + name(t));

    // fused residual: x_mid = round(x + r) exactly, then the same LayerNorm
    const vec r = uniform(n, -1, 1, 53, t);
    vec mid(n);
    for (std::size_t i = 0; i < n; ++i) mid[i] = round_to(t, x[i] + r[i]);
    const auto midd = as_double(mid);
    std::vector<double> y2(n), mean2(md.size()), rstd2(md.size());
    cpu::layernorm_fwd(y2.data(), mean2.data(), rstd2.data(), midd.data(), gd.data(), bd.data(), rows, dim);
    const auto fused = TEST_BACKEND::layernorm_fwd(t, x, r, gamma, beta, rows, dim);
    check_equal(fused.x_mid, mid, std::string("residual_layernorm x_mid ") + name(t));
    check_close(fused.y, as_float(y2), u + 1e-6, 1e-5, std::string("residual_layernorm y ") + name(t));

    for (dtype g : {dtype::f32, t}) {
      const vec dy = uniform(n, -1, 1, 54, t);
      const vec dx0 = uniform(n, -1, 1, 55, t), dg0 = uniform(nd, -1, 1, 56, g), db0 = uniform(nd, -1, 1, 57, g);
      // the oracle from the statistics the backend is given (float)
      auto dx = as_double(dx0), dgam = as_double(dg0), dbet = as_double(db0);
      const auto dyd = as_double(dy), mf = as_double(mean), rf = as_double(rstd);
      cpu::layernorm_bwd(dx.data(), dgam.data(), dbet.data(), dyd.data(), xd.data(), mf.data(), rf.data(), gd.data(),
                         rows, dim);
      vec gdx = dx0, gdg = dg0, gdb = db0;
      TEST_BACKEND::layernorm_bwd(t, g, gdx, gdg, gdb, dy, x, mean, rstd, gamma, rows, dim);
      // dx: per-row sums in double, a few float roundings of terms of size <= rs·(|dy γ| + |a| + |x̂ c|) ~ 10
      check_close(gdx, as_float(dx), u + 1e-6, 1e-5 * 10, std::string("layernorm dx ") + name(t));
      // dgamma/dbeta: rows summed in another order: 2·rows·2^-24·Σ|dy x̂| (<= rows·3), then one rounding to G
      vec bg(nd), bb(nd);
      for (std::size_t j = 0; j < nd; ++j) {
        double sg = 0, sb = 0;
        for (index_t i = 0; i < rows; ++i) {
          const auto e = static_cast<std::size_t>(i * dim) + j;
          sg += std::fabs(dy[e] * (x[e] - mean[static_cast<std::size_t>(i)]) * rstd[static_cast<std::size_t>(i)]);
          sb += std::fabs(dy[e]);
        }
        bg[j] = static_cast<float>(2.0 * (rows + 2) * 0x1p-24 * (sg + std::fabs(dg0[j])) + unit_roundoff(g) * std::fabs(dgam[j]));
        bb[j] = static_cast<float>(2.0 * (rows + 2) * 0x1p-24 * (sb + std::fabs(db0[j])) + unit_roundoff(g) * std::fabs(dbet[j]));
      }
      check_within(gdg, as_float(dgam), bg, std::string("layernorm dgamma ") + name(t) + "/" + name(g));
      check_within(gdb, as_float(dbet), bb, std::string("layernorm dbeta ") + name(t) + "/" + name(g));
      vec again_dx = dx0, again_dg = dg0, again_db = db0;
      TEST_BACKEND::layernorm_bwd(t, g, again_dx, again_dg, again_db, dy, x, mean, rstd, gamma, rows, dim);
      CHECK(bit_identical(again_dx, gdx));
      CHECK(bit_identical(again_dg, gdg));
      CHECK(bit_identical(again_db, gdb));
    }
  }
}

#ifdef TEST_BACKEND_CPU

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

#endif  // TEST_BACKEND_CPU
