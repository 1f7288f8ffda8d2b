// The SGD update on the CPU against PyTorch's torch.optim.SGD written out in double: momentum,
// Nesterov's form, weight decay, the first update's buffer; the skip flag; the check that refuses
// an update which would store a non-finite value, against the update itself.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <etude/etude.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

TEST_CASE("sgd_update follows PyTorch's SGD with momentum, plain and Nesterov", "[ops]") {
  for (int nesterov : {0, 1}) {
    INFO("nesterov " << nesterov);
    const index_t n = 29;
    const double lr = 0.05, mu = 0.9, wd = 0.01, scale = 0.25;
    auto p = random_vector(n, 71);
    std::vector<double> buf(n, 123.0), working(n);  // the first update ignores the buffer's contents
    auto want_p = p, want_buf = buf;
    const int run = 0;
    for (int t = 1; t <= 3; ++t) {
      const auto g = random_vector(n, 72 + std::uint64_t(t));
      const etude::optim::sgd_scalars sc{lr, mu, wd, nesterov, t == 1};
      cpu::sgd_update(p.data(), g.data(), buf.data(), n, &sc, &scale, &run, working.data());
      for (index_t i = 0; i < n; ++i) {
        const double gi = g[i] * scale + wd * want_p[i];
        want_buf[i] = t == 1 ? gi : mu * want_buf[i] + gi;
        want_p[i] -= lr * (nesterov ? gi + mu * want_buf[i] : want_buf[i]);
      }
    }
    for (index_t i = 0; i < n; ++i) {
      CHECK(p[i] == Approx(want_p[i]).epsilon(1e-13));
      CHECK(buf[i] == Approx(want_buf[i]).epsilon(1e-13));
      CHECK(working[i] == p[i]);
    }
    const auto before = p;
    const int skip = 1;
    const etude::optim::sgd_scalars sc{lr, mu, wd, nesterov, 0};
    const auto g = random_vector(n, 80);
    cpu::sgd_update(p.data(), g.data(), buf.data(), n, &sc, &scale, &skip, working.data());
    CHECK(p == before);
  }
}

namespace {
// The plain reference of sgd_check: the update on copies, the first stored value that is not
// finite in (element, what) order.
template <class P>
etude::index_t first_non_finite_stored(std::vector<float> p, const std::vector<float>& g, std::vector<float> buf,
                                       const etude::optim::sgd_scalars& sc, bool with_working) {
  const auto n = static_cast<index_t>(p.size());
  std::vector<P> working(p.size(), P(0.0f));
  const double scale = 1.0;
  const int run = 0;
  cpu::sgd_update(p.data(), g.data(), buf.data(), n, &sc, &scale, &run, with_working ? working.data() : nullptr);
  for (index_t i = 0; i < n; ++i) {
    const auto u = static_cast<std::size_t>(i);
    if (!std::isfinite(buf[u])) return etude::update_value_key(i, etude::update_value_state0);
    if (!std::isfinite(p[u])) return etude::update_value_key(i, etude::update_value_weight);
    if (with_working && !std::isfinite(static_cast<float>(working[u])))
      return etude::update_value_key(i, etude::update_value_working);
  }
  return -1;
}
}  // namespace

TEST_CASE("sgd_check refuses exactly the updates that would store a non-finite value, naming the first", "[ops]") {
  const index_t n = 33;
  const auto rp = random_vector(n, 96), rg = random_vector(n, 97), rb = random_vector(n, 98);
  struct variant {
    const char* what;
    double lr;
    int first;
    void (*edit)(std::vector<float>& p, std::vector<float>& g, std::vector<float>& buf);
    etude::index_t want;
    bool fp16_working;
  };
  const variant variants[] = {
      {"a sane learning rate", 0.05, 0, [](auto&, auto&, auto&) {}, -1, false},
      {"lr 1e39 (infinite in float): every weight", 1e39, 0, [](auto&, auto&, auto&) {},
       etude::update_value_key(0, etude::update_value_weight), false},
      {"the momentum buffer", 0.05, 0, [](auto&, auto& g, auto& buf) { g[11] = buf[11] = 3e38f; },
       etude::update_value_key(11, etude::update_value_state0), false},
      {"the first update ignores the old buffer", 0.05, 1, [](auto&, auto&, auto& buf) { buf[11] = 3e38f; }, -1,
       false},
      {"an fp16 working copy above 65504", 0.05, 0, [](auto& p, auto&, auto&) { p[20] = 7e4f; },
       etude::update_value_key(20, etude::update_value_working), true},
  };
  for (const variant& c : variants) {
    INFO(c.what);
    for (int nesterov : {0, 1}) {
      INFO("nesterov " << nesterov);
      std::vector<float> p(rp.begin(), rp.end()), g(rg.begin(), rg.end()), buf(rb.begin(), rb.end());
      c.edit(p, g, buf);
      const etude::optim::sgd_scalars sc{c.lr, 0.9, 0.01, nesterov, c.first};
      CHECK((c.fp16_working ? first_non_finite_stored<etude::fp16>(p, g, buf, sc, true)
                            : first_non_finite_stored<float>(p, g, buf, sc, false)) == c.want);
      const auto p0 = p, b0 = buf;
      etude::step_decision d{};
      d.grad_scale = 1.0;
      d.refused = -1;
      std::vector<etude::fp16> working(p.size(), etude::fp16(0.0f));
      if (c.fp16_working)
        cpu::sgd_check(p.data(), g.data(), buf.data(), n, &sc, &d, working.data());
      else
        cpu::sgd_check(p.data(), g.data(), buf.data(), n, &sc, &d, static_cast<const float*>(nullptr));
      CHECK(d.refused == c.want);
      CHECK(d.skip == (c.want >= 0 ? 1 : 0));
      CHECK(d.status == (c.want >= 0 ? etude::step_update_not_finite : 0));
      CHECK(p == p0);
      CHECK(buf == b0);
    }
  }
}
