// The input embedding on the CPU: the codebook sum's backward against central differences, the
// positions against AudioCraft's formula.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <etude/etude.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

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
