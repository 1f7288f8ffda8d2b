// The input embedding, written once for every backend (the category file ETUDE_OPS_CATEGORY names
// it: tests/ops/category_cpu.hpp in test_ops, category_cuda.hpp in test_gpu_ops and test_sim_ops):
// forward and backward in f32 and bf16 against the CPU in float on the same values, bit for bit, and
// two backward runs bit-identical. On the CPU only: the codebook sum's backward against central
// differences and against the plain loop's order, bit for bit, for any thread count; the positions
// against AudioCraft's formula.
#include ETUDE_OPS_CATEGORY

#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>
#include <etude/core/rng.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

TEST_CASE(TEST_BACKEND_NAME ": embedding forward and backward match the CPU bit for bit and are deterministic",
          "[ops][embedding]") {
  const index_t batch = 3, steps = 37, dim = 40, card = 7;  // small card: many repeated tokens
  const int codebooks = 4;
  std::mt19937 gen(9);
  std::uniform_int_distribution<int> tok(0, static_cast<int>(card));  // card itself: the special token
  tokens seq(static_cast<std::size_t>(batch * codebooks * steps));
  for (etude::token_t& t : seq) t = tok(gen);
  for (dtype t : {dtype::f32, dtype::bf16}) {
    std::vector<vec> tables;
    std::vector<const float*> ptrs;
    for (int k = 0; k < codebooks; ++k) tables.push_back(uniform(static_cast<std::size_t>((card + 1) * dim), -1, 1, 10 + k, t));
    for (auto& tb : tables) ptrs.push_back(tb.data());
    const vec pos = uniform(static_cast<std::size_t>(steps * dim), -1, 1, 20);
    // the same float additions in the same order (codebooks, then positions), rounded once
    vec want(static_cast<std::size_t>(batch * steps * dim));
    cpu::embedding_fwd(want.data(), seq.data(), ptrs.data(), pos.data(), batch, codebooks, steps, dim);
    check_equal(TEST_BACKEND::embedding_fwd(t, seq, tables, pos, batch, codebooks, steps, dim), round_to(t, want),
                std::string("embedding_fwd ") + name(t));

    for (dtype g : {dtype::f32, dtype::bf16}) {
      const vec dx = uniform(static_cast<std::size_t>(batch * steps * dim), -1, 1, 30, t);
      std::vector<vec> want_d, got_d, again;
      for (int k = 0; k < codebooks; ++k) want_d.push_back(uniform(static_cast<std::size_t>((card + 1) * dim), -1, 1, 40 + k, g));
      got_d = want_d;
      again = want_d;
      if (g == dtype::f32) {
        std::vector<float*> dp;
        for (auto& d : want_d) dp.push_back(d.data());
        cpu::embedding_bwd(dp.data(), dx.data(), seq.data(), batch, codebooks, steps, dim);
      } else {
        std::vector<std::vector<etude::bf16>> h(want_d.size());
        std::vector<etude::bf16*> dp;
        for (std::size_t k = 0; k < want_d.size(); ++k) {
          for (float v : want_d[k]) h[k].push_back(etude::bf16(v));
          dp.push_back(h[k].data());
        }
        cpu::embedding_bwd(dp.data(), dx.data(), seq.data(), batch, codebooks, steps, dim);
        for (std::size_t k = 0; k < want_d.size(); ++k)
          for (std::size_t i = 0; i < h[k].size(); ++i) want_d[k][i] = static_cast<float>(h[k][i]);
      }
      TEST_BACKEND::embedding_bwd(g, t, got_d, dx, seq, batch, codebooks, steps, dim);
      TEST_BACKEND::embedding_bwd(g, t, again, dx, seq, batch, codebooks, steps, dim);
      for (int k = 0; k < codebooks; ++k) {
        // rows added in the CPU's order (positions ascending) from the same start: identical
        check_equal(got_d[static_cast<std::size_t>(k)], want_d[static_cast<std::size_t>(k)],
                    std::string("embedding_bwd ") + name(t) + " grads " + name(g));
        CHECK(bit_identical(got_d[static_cast<std::size_t>(k)], again[static_cast<std::size_t>(k)]));
      }
    }
  }
}

#ifdef TEST_BACKEND_CPU

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

// The backward's sums in position order, whatever the thread count: against the plain loop over
// positions (each table row's additions in that order, rounded to the gradient's type each time),
// bit for bit, onto gradients already holding values (+=), with tokens repeated many times, some
// never seen, and a special token above the others; float and bf16 gradients, one thread and two.
template <class G>
void check_embedding_order(int threads) {
  const index_t batch = 3, steps = 101, dim = 40;
  const int k = 3, card = 60;
  etude::rng r(17);
  std::vector<etude::token_t> seq(static_cast<std::size_t>(batch * k * steps));
  for (auto& t : seq) t = static_cast<etude::token_t>(r.below(4) == 0 ? card : r.below(card / 2));
  std::vector<etude::bf16> dx(static_cast<std::size_t>(batch * steps * dim));
  for (auto& v : dx) v = etude::bf16(static_cast<float>(r.uniform(-1.0, 1.0)));
  const std::size_t table = static_cast<std::size_t>((card + 1) * dim);
  std::vector<G> got(k * table), want(k * table);
  for (std::size_t i = 0; i < got.size(); ++i) got[i] = want[i] = G(static_cast<float>(r.uniform(-1.0, 1.0)));
  std::vector<G*> tables(k);
  for (int c = 0; c < k; ++c) tables[std::size_t(c)] = got.data() + c * table;
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  cpu::embedding_bwd(tables.data(), dx.data(), seq.data(), batch, k, steps, dim);
  omp_set_num_threads(before);
  for (int c = 0; c < k; ++c)
    for (index_t b = 0; b < batch; ++b)
      for (index_t s = 0; s < steps; ++s) {
        G* row = want.data() + c * table + std::size_t(seq[std::size_t((b * k + c) * steps + s)]) * dim;
        for (index_t j = 0; j < dim; ++j)
          row[j] = G(static_cast<float>(row[j]) + static_cast<float>(dx[std::size_t((b * steps + s) * dim + j)]));
      }
  CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(G)) == 0);
}

TEST_CASE("embedding backward: each table row's sums in position order, for any thread count", "[ops]") {
  for (int threads : {1, 2}) {
    check_embedding_order<float>(threads);
    check_embedding_order<etude::bf16>(threads);
  }
}

#endif  // TEST_BACKEND_CPU
