// The SGD update on the CPU against PyTorch's torch.optim.SGD written out in double: momentum,
// Nesterov's form, weight decay, the first update's buffer; the skip flag.
#include <catch2/catch.hpp>

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
