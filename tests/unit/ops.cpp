// The CPU op set, op by op: each backward against central differences of its forward in double
// precision, the vectorised exponential against libm, determinism of the reductions.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <vector>

#include <etude/etude.hpp>

using cpu = etude::backend::cpu;
using etude::index_t;

namespace {

std::vector<double> random_vector(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  etude::rng r(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = r.uniform(-scale, scale);
  return v;
}

// Checks grad (analytic d loss / d x) against central differences of loss at every element.
// With a stride, every stride-th element (the forward is re-run twice per element).
void check_gradient(std::vector<double>& x, const std::vector<double>& grad, const std::function<double()>& loss,
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

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

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

TEST_CASE("causal attention backward matches central differences", "[ops]") {
  const index_t batch = 2, steps = cpu::attention_rows + 9, head_dim = 3;  // two row blocks
  const int heads = 2;
  const index_t d = heads * head_dim;
  auto qkv = random_vector(batch * steps * 3 * d, 5);
  const auto dout = random_vector(batch * steps * d, 6);
  std::vector<double> att(batch * steps * d), lse(batch * steps * heads);
  std::vector<double> scratch(static_cast<std::size_t>(cpu::attention_scratch(steps, head_dim, false, cpu::threads())));
  auto loss = [&] {
    cpu::attention_fwd(att.data(), lse.data(), qkv.data(), batch, steps, heads, head_dim, scratch.data(), index_t(scratch.size()));
    return dot(att, dout);
  };
  loss();
  std::vector<double> dqkv(qkv.size());
  cpu::attention_bwd(dqkv.data(), dout.data(), qkv.data(), lse.data(), batch, steps, heads, head_dim, scratch.data(),
                     index_t(scratch.size()));
  check_gradient(qkv, dqkv, loss, "dqkv", 5);
}

TEST_CASE("causal attention forward equals a naive softmax over the past", "[ops]") {
  const index_t steps = 4, head_dim = 2;
  const int heads = 1;
  const auto qkv = random_vector(steps * 3 * head_dim, 7);
  std::vector<double> att(steps * head_dim), lse(steps);
  std::vector<double> scratch(static_cast<std::size_t>(cpu::attention_scratch(steps, head_dim, false, cpu::threads())));
  cpu::attention_fwd(att.data(), lse.data(), qkv.data(), 1, steps, heads, head_dim, scratch.data(), index_t(scratch.size()));
  auto q = [&](index_t i, index_t j) { return qkv[static_cast<std::size_t>(i * 3 * head_dim + j)]; };
  auto k = [&](index_t i, index_t j) { return qkv[static_cast<std::size_t>(i * 3 * head_dim + head_dim + j)]; };
  auto v = [&](index_t i, index_t j) { return qkv[static_cast<std::size_t>(i * 3 * head_dim + 2 * head_dim + j)]; };
  for (index_t i = 0; i < steps; ++i) {
    std::vector<double> w(static_cast<std::size_t>(i + 1));
    double z = 0;
    for (index_t j = 0; j <= i; ++j) {
      double s = 0;
      for (index_t c = 0; c < head_dim; ++c) s += q(i, c) * k(j, c);
      w[static_cast<std::size_t>(j)] = std::exp(s / std::sqrt(double(head_dim)));
      z += w[static_cast<std::size_t>(j)];
    }
    CHECK(lse[static_cast<std::size_t>(i)] == Approx(std::log(z)).epsilon(1e-12));
    for (index_t c = 0; c < head_dim; ++c) {
      double o = 0;
      for (index_t j = 0; j <= i; ++j) o += w[static_cast<std::size_t>(j)] / z * v(j, c);
      CHECK(att[static_cast<std::size_t>(i * head_dim + c)] == Approx(o).epsilon(1e-12));
    }
  }
}

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

TEST_CASE("softmax cross-entropy: loss and in-place gradient", "[ops]") {
  const index_t rows = 4, card = 7;
  auto logits = random_vector(rows * card, 10, 3.0);
  const std::vector<etude::token_t> target{3, -1, 0, 6};
  const double weight = 0.25;
  auto loss = [&] {
    auto copy = logits;
    return cpu::softmax_xent(copy.data(), target.data(), rows, card, 0.0) * weight;
  };
  auto grad = logits;
  const double total = cpu::softmax_xent(grad.data(), target.data(), rows, card, weight);
  double expected = 0;
  for (index_t r = 0; r < rows; ++r) {
    if (target[static_cast<std::size_t>(r)] < 0) continue;
    double z = 0;
    for (index_t j = 0; j < card; ++j) z += std::exp(logits[static_cast<std::size_t>(r * card + j)]);
    expected += std::log(z) - logits[static_cast<std::size_t>(r * card + target[static_cast<std::size_t>(r)])];
  }
  CHECK(total == Approx(expected).epsilon(1e-12));
  for (index_t j = 0; j < card; ++j) CHECK(grad[static_cast<std::size_t>(card + j)] == 0.0);  // ignored row
  check_gradient(logits, grad, loss, "dlogits");
}

TEST_CASE("embedding sum and its backward", "[ops]") {
  const index_t batch = 2, steps = 3, dim = 4;
  const int k = 2, card = 5;
  auto t0 = random_vector((card + 1) * dim, 11), t1 = random_vector((card + 1) * dim, 12);
  const auto pos = random_vector(steps * dim, 13);
  const std::vector<etude::token_t> seq{5, 1, 1, 0, 2, 5, 3, 3, 4, 1, 1, 2};  // (B, K, S); 5 = special
  const auto dx = random_vector(batch * steps * dim, 14);
  std::vector<double> x(batch * steps * dim);
  auto loss = [&] {
    const double* tables[] = {t0.data(), t1.data()};
    cpu::embedding_fwd(x.data(), seq.data(), tables, pos.data(), batch, k, steps, dim);
    return dot(x, dx);
  };
  std::vector<double> d0(t0.size(), 0.0), d1(t1.size(), 0.0);
  double* dtables[] = {d0.data(), d1.data()};
  cpu::embedding_bwd(dtables, dx.data(), seq.data(), batch, k, steps, dim);
  check_gradient(t0, d0, loss, "table 0");
  check_gradient(t1, d1, loss, "table 1");
}

TEST_CASE("sinusoidal positions: cos first, half-1 in the exponent", "[ops]") {
  const index_t steps = 6, dim = 8;
  std::vector<double> pos(steps * dim);
  cpu::sinusoid(pos.data(), steps, dim);
  for (index_t s = 0; s < steps; ++s)
    for (index_t j = 0; j < dim / 2; ++j) {
      const double phase = double(s) / std::pow(10000.0, double(j) / double(dim / 2 - 1));
      CHECK(pos[static_cast<std::size_t>(s * dim + j)] == Approx(std::cos(phase)).epsilon(1e-14));
      CHECK(pos[static_cast<std::size_t>(s * dim + dim / 2 + j)] == Approx(std::sin(phase)).epsilon(1e-14));
    }
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

TEST_CASE("sum of squares is deterministic and exact enough", "[ops]") {
  std::vector<float> v(100003);
  etude::rng r(15);
  double ref = 0;
  for (auto& x : v) {
    x = static_cast<float>(r.uniform(-1, 1));
    ref += double(x) * x;
  }
  const double a = cpu::sum_squares(v.data(), static_cast<index_t>(v.size()));
  const double b = cpu::sum_squares(v.data(), static_cast<index_t>(v.size()));
  CHECK(a == b);
  CHECK(a == Approx(ref).epsilon(1e-12));
}
