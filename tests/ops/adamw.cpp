// The AdamW update on the CPU against PyTorch's formula written out in double, over three updates
// with weight decay, a gradient factor and bias corrections; the skip flag; the working copy.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <etude/etude.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

TEST_CASE("adamw_update follows PyTorch's AdamW", "[ops]") {
  etude::hyper h;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.eps = 1e-8;
  h.weight_decay = 0.1;
  const double lr = 1e-2, scale = 0.5;
  const index_t n = 37;
  auto p = random_vector(n, 51);
  std::vector<double> m(n, 0.0), v(n, 0.0), working(n);
  auto want_p = p, want_m = m, want_v = v;
  const int run = 0;
  for (long t = 1; t <= 3; ++t) {
    const auto g = random_vector(n, 52 + std::uint64_t(t));
    const auto sc = etude::optim::adamw::make_scalars(h, lr, t);
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, &sc, &scale, &run, working.data());
    for (index_t i = 0; i < n; ++i) {
      const double gi = g[i] * scale;
      want_p[i] *= 1 - lr * h.weight_decay;
      want_m[i] = h.beta1 * want_m[i] + (1 - h.beta1) * gi;
      want_v[i] = h.beta2 * want_v[i] + (1 - h.beta2) * gi * gi;
      const double mhat = want_m[i] / (1 - std::pow(h.beta1, double(t)));
      const double vhat = want_v[i] / (1 - std::pow(h.beta2, double(t)));
      want_p[i] -= lr * mhat / (std::sqrt(vhat) + h.eps);
    }
  }
  for (index_t i = 0; i < n; ++i) {
    CHECK(p[i] == Approx(want_p[i]).epsilon(1e-12));
    CHECK(m[i] == Approx(want_m[i]).epsilon(1e-12));
    CHECK(v[i] == Approx(want_v[i]).epsilon(1e-12));
    CHECK(working[i] == p[i]);
  }
}

TEST_CASE("adamw_update: the skip flag changes nothing; a bf16 working copy is the rounded master", "[ops]") {
  const index_t n = 20;
  const auto g = random_vector(n, 61);
  std::vector<float> p(n, 0.3f), m(n, 0.0f), v(n, 0.0f);
  std::vector<etude::bf16> working(n, etude::bf16(0.0f));
  const auto sc = etude::optim::adamw::make_scalars(etude::hyper{}, 1e-3, 1);
  const double scale = 1.0;
  const std::vector<float> grad(g.begin(), g.end());
  const int skip = 1, run = 0;
  cpu::adamw_update(p.data(), grad.data(), m.data(), v.data(), n, &sc, &scale, &skip, working.data());
  for (index_t i = 0; i < n; ++i) {
    CHECK(p[i] == 0.3f);
    CHECK(m[i] == 0.0f);
    CHECK(static_cast<float>(working[i]) == 0.0f);
  }
  cpu::adamw_update(p.data(), grad.data(), m.data(), v.data(), n, &sc, &scale, &run, working.data());
  for (index_t i = 0; i < n; ++i) {
    CHECK(p[i] != 0.3f);
    CHECK(working[i].bits == etude::bf16(p[i]).bits);
  }
}
