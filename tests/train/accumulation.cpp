// Gradient accumulation: accumulate<4> over microbatches of 2 is the same update as one batch of
// 8 (token normalisation), even with uneven padding; mean-of-means matches its own definition.
#include <catch2/catch.hpp>

#include <cmath>

#include <etude/etude.hpp>

#include "../support.hpp"

namespace pat = etude::pattern;
using etude::index_t;

namespace {

constexpr etude::shape shape{.codebooks = 4, .card = 32, .dim = 32, .heads = 4, .layers = 2, .max_len = 128};
using lm = etude::model<shape, pat::delay<0, 1, 2, 3>>;

// Eight examples with very different amounts of padding.
etude::token_batch uneven_batch() {
  etude::token_batch b(8, shape.codebooks, 24);
  etude::rng r(77);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(shape.card));
  for (index_t e = 0; e < 8; ++e)
    for (int k = 0; k < shape.codebooks; ++k)
      for (index_t t = 24 - 2 * e - (e % 3) * k; t < 24; ++t) b.mask_at(e, k, t) = 0;
  return b;
}

}  // namespace

TEST_CASE("4 microbatches of 2 give the same update as one batch of 8", "[accumulation]") {
  etude::hyper h;
  h.lr = 1e-2;
  h.warmup_steps = 0;
  h.total_steps = 10;
  etude::cpu_trainer<etude::train_config<lm, etude::accumulate<4>>> acc{h};
  etude::cpu_trainer<etude::train_config<lm, etude::accumulate<1>>> whole{h};
  const auto data = uneven_batch();
  const auto ga = acc.loss_and_gradients(data);
  const auto gw = whole.loss_and_gradients(data);
  CHECK(ga.ce == Approx(gw.ce).epsilon(1e-6));
  CHECK(ga.tokens == gw.tokens);
  for (int k = 0; k < shape.codebooks; ++k) CHECK(ga.ce_q[k] == Approx(gw.ce_q[k]).epsilon(1e-6));
  for (const auto& p : lm::params::entries) {
    INFO(etude::param_name(p));
    CHECK(etude::test::relative_l2(acc.gradient(p), whole.gradient(p)) < 1e-6);
  }
  // three AdamW updates: Adam's first steps move each weight by about ±lr whatever the size of
  // its gradient, so a gradient of 1e-8 (below eps) that differs by rounding moves its weight
  // differently; the parameters are held to 1e-5, the losses to 1e-6
  for (int s = 0; s < 3; ++s) {
    const auto a = acc.step(data), w = whole.step(data);
    CHECK(a.ce == Approx(w.ce).epsilon(1e-6));
    CHECK(a.grad_norm == Approx(w.grad_norm).epsilon(1e-6));
  }
  for (const auto& p : lm::params::entries) {
    INFO(etude::param_name(p));
    CHECK(etude::test::relative_l2(acc.tensor(p), whole.tensor(p)) < 1e-5);
  }
}

TEST_CASE("an update linear in the gradient is the same either way (double precision)", "[accumulation]") {
  // In float the updates themselves are rounded against weights near 1 (norm scales), which
  // hides the comparison; in double the equivalence is exact up to summation order.
  etude::hyper h;
  h.lr = 0.5;
  h.weight_decay = 0.0;
  using sgd = etude::optim::sgd<>;
  using constant = etude::schedule::constant;
  etude::cpu_trainer<etude::train_config<lm, etude::precision::fp64, etude::accumulate<4>, sgd, constant>> acc{h};
  etude::cpu_trainer<etude::train_config<lm, etude::precision::fp64, sgd, constant>> whole{h};
  const std::vector<double> start(acc.parameters().begin(), acc.parameters().end());
  const auto data = uneven_batch();
  acc.step(data);
  whole.step(data);
  for (const auto& p : lm::params::entries) {
    INFO(etude::param_name(p));
    double num = 0, den = 0;
    for (index_t i = 0; i < p.numel(); ++i) {
      const double s = start[static_cast<std::size_t>(p.offset + i)];
      const double da = acc.tensor(p)[static_cast<std::size_t>(i)] - s, dw = whole.tensor(p)[static_cast<std::size_t>(i)] - s;
      num += (da - dw) * (da - dw);
      den += dw * dw;
    }
    CHECK(std::sqrt(num / den) < 1e-10);
  }
}

TEST_CASE("token normalisation differs from the mean of microbatch means under uneven padding", "[accumulation]") {
  etude::cpu_trainer<etude::train_config<lm, etude::accumulate<4>>> tokens;
  etude::cpu_trainer<etude::train_config<lm, etude::accumulate<4, etude::loss_norm::mean_of_means>>> means;
  const auto data = uneven_batch();
  CHECK(std::abs(tokens.loss_and_gradients(data).ce - means.loss_and_gradients(data).ce) > 1e-4);
}

TEST_CASE("mean of means: the average of each microbatch's own loss and gradient", "[accumulation]") {
  using mom_cfg = etude::train_config<lm, etude::precision::fp64, etude::accumulate<4, etude::loss_norm::mean_of_means>>;
  using one_cfg = etude::train_config<lm, etude::precision::fp64>;
  etude::cpu_trainer<mom_cfg> mom;
  etude::cpu_trainer<one_cfg> one;
  const auto data = uneven_batch();
  const auto st = mom.loss_and_gradients(data);
  double ce = 0;
  std::vector<double> ce_q(shape.codebooks, 0.0);
  std::vector<double> grad(one.gradients().size(), 0.0);
  for (index_t m = 0; m < 4; ++m) {
    const auto part = one.loss_and_gradients(data.examples(2 * m, 2));
    ce += part.ce / 4;
    for (int k = 0; k < shape.codebooks; ++k) ce_q[static_cast<std::size_t>(k)] += part.ce_q[static_cast<std::size_t>(k)] / 4;
    for (std::size_t i = 0; i < grad.size(); ++i) grad[i] += one.gradients()[i] / 4;
  }
  CHECK(st.ce == Approx(ce).epsilon(1e-12));
  for (int k = 0; k < shape.codebooks; ++k) CHECK(st.ce_q[static_cast<std::size_t>(k)] == Approx(ce_q[static_cast<std::size_t>(k)]).epsilon(1e-12));
  for (std::size_t i = 0; i < grad.size(); ++i) REQUIRE(mom.gradients()[i] == Approx(grad[i]).epsilon(1e-10).margin(1e-14));
}
