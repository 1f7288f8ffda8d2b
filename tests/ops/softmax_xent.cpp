// Softmax cross-entropy on the CPU: the loss against its definition, the in-place gradient
// against central differences, ignored rows, evaluation (weight 0).
#include <catch2/catch.hpp>

#include <cmath>
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
