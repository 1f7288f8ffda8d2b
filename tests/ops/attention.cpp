// Causal attention on the CPU: the forward against a naive softmax over the past, the backward
// against central differences, in double.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <etude/etude.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

namespace {

void check_attention_gradient(index_t batch, index_t steps, int heads, std::size_t stride) {
  constexpr index_t head_dim = 3;
  const index_t d = heads * head_dim;
  auto qkv = random_vector(batch * steps * 3 * d, 5);
  const auto dout = random_vector(batch * steps * d, 6);
  std::vector<double> att(batch * steps * d), lse(batch * steps * heads);
  std::vector<double> scratch(static_cast<std::size_t>(cpu::attention_scratch(steps, head_dim, false, cpu::threads())));
  auto loss = [&] {
    cpu::attention_fwd<head_dim>(att.data(), lse.data(), qkv.data(), batch, steps, heads, scratch.data(),
                                 index_t(scratch.size()));
    return dot(att, dout);
  };
  loss();
  std::vector<double> dqkv(qkv.size());
  cpu::attention_bwd<head_dim>(dqkv.data(), dout.data(), att.data(), qkv.data(), lse.data(), batch, steps, heads,
                               scratch.data(), index_t(scratch.size()));
  check_gradient(qkv, dqkv, loss, "dqkv", stride);
}

}  // namespace

TEST_CASE("causal attention backward matches central differences", "[ops]") {
  // two row blocks of a short sequence's height
  check_attention_gradient(2, cpu::attention_rows(64) + 9, 2, 5);
}

TEST_CASE("causal attention in a long sequence's taller blocks matches central differences", "[ops]") {
  const index_t steps = 600;  // above 512: blocks of 128 rows, the last one partial
  REQUIRE(cpu::attention_rows(steps) == 128);
  REQUIRE(cpu::attention_rows(cpu::attention_rows(64) + 9) == 64);
  check_attention_gradient(1, steps, 1, 97);
}

TEST_CASE("causal attention forward equals a naive softmax over the past", "[ops]") {
  constexpr index_t head_dim = 2;
  const index_t steps = 4;
  const int heads = 1;
  const auto qkv = random_vector(steps * 3 * head_dim, 7);
  std::vector<double> att(steps * head_dim), lse(steps);
  std::vector<double> scratch(static_cast<std::size_t>(cpu::attention_scratch(steps, head_dim, false, cpu::threads())));
  cpu::attention_fwd<head_dim>(att.data(), lse.data(), qkv.data(), 1, steps, heads, scratch.data(), index_t(scratch.size()));
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
