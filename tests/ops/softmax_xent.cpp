// Softmax cross-entropy on the CPU: the loss against its definition, the in-place gradient
// against central differences, ignored rows, evaluation (weight 0).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include <etude/etude.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

TEST_CASE("softmax cross-entropy: loss and in-place gradient", "[ops]") {
  const index_t rows = 4, card = 7;
  auto logits = random_vector(rows * card, 10, 3.0);
  const std::vector<etude::token_t> target{3, -1, 0, 6};
  const double weight = 0.25;
  const double zero = 0.0;
  auto loss = [&] {
    auto copy = logits;
    double sum = 0.0;
    cpu::softmax_xent(copy.data(), target.data(), rows, card, &zero, &sum);
    CHECK(copy == logits);  // weight 0 (evaluation) leaves the logits alone
    return sum * weight;
  };
  auto grad = logits;
  double total = 1.5;  // the op adds to what is there
  cpu::softmax_xent(grad.data(), target.data(), rows, card, &weight, &total);
  total -= 1.5;
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

// 16-bit and float logits, as the heads store them: the loss within float roundings of the exact
// one, each gradient the exact w·(softmax − one-hot) within one rounding to the stored type (and
// float roundings before it), rows of a whole codebook's width in parallel (and of a width that
// is not a multiple of the 16 lanes the CPU's kernels take: rows lie next to each other).
template <class L>
void check_narrow_logits(double unit_roundoff, index_t card) {
  const index_t rows = 37;
  const auto values = random_vector(std::size_t(rows * card), 11, 4.0);
  std::vector<L> logits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) logits[i] = L(static_cast<float>(values[i]));
  std::vector<etude::token_t> target(static_cast<std::size_t>(rows));
  for (index_t r = 0; r < rows; ++r) target[std::size_t(r)] = r % 5 == 4 ? -1 : static_cast<etude::token_t>((r * 811) % card);
  const float weight = 0.125f;
  auto grad = logits;
  double total = 0.0;
  cpu::softmax_xent(grad.data(), target.data(), rows, card, &weight, &total);
  // the loss alone (weight 0, as evaluation asks) is the same bits and leaves the logits
  auto kept = logits;
  double loss_alone = 0.0;
  const float none = 0.0f;
  cpu::softmax_xent(kept.data(), target.data(), rows, card, &none, &loss_alone);
  CHECK(loss_alone == total);
  CHECK(std::memcmp(kept.data(), logits.data(), logits.size() * sizeof(L)) == 0);
  double expected = 0.0, worst = 0.0;
  for (index_t r = 0; r < rows; ++r) {
    const auto t = target[std::size_t(r)];
    const auto x = [&](index_t j) { return static_cast<double>(static_cast<float>(logits[std::size_t(r * card + j)])); };
    const auto g = [&](index_t j) { return static_cast<double>(static_cast<float>(grad[std::size_t(r * card + j)])); };
    if (t < 0) {
      for (index_t j = 0; j < card; ++j) CHECK(g(j) == 0.0);
      continue;
    }
    double mx = x(0), z = 0.0;
    for (index_t j = 0; j < card; ++j) mx = std::max(mx, x(j));
    for (index_t j = 0; j < card; ++j) z += std::exp(x(j) - mx);
    expected += mx + std::log(z) - x(t);
    for (index_t j = 0; j < card; ++j) {
      const double want = weight * (std::exp(x(j) - mx) / z - (j == t ? 1.0 : 0.0));
      // float work (an exponential within 2 ulp, a sum of card terms, a quotient) and one rounding
      const double bound = unit_roundoff * std::abs(want) + 16 * 0x1p-24 * weight + 1e-30;
      worst = std::max(worst, std::abs(g(j) - want) / bound);
    }
  }
  CHECK(worst <= 1.0);
  CHECK(total == Approx(expected).epsilon(double(card) * 0x1p-24));
}

TEST_CASE("softmax cross-entropy on bf16 and float logits: one rounding from the exact gradient", "[ops]") {
  for (const index_t card : {2048, 2051}) {
    INFO("card = " << card);
    check_narrow_logits<etude::bf16>(0x1p-8, card);
    check_narrow_logits<float>(0x1p-24, card);
  }
}
