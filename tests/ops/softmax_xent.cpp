// Softmax cross-entropy, written once for every backend (the category file ETUDE_OPS_CATEGORY names
// it: tests/ops/category_cpu.hpp in test_ops, category_cuda.hpp in test_gpu_ops and test_sim_ops):
// the loss, the in-place gradients, ignored rows and weight 0 in f32, bf16 and fp16 against the CPU in
// float on the same values, and two runs bit-identical. On the CPU only: the loss against its
// definition, the in-place gradient against central differences (fp64), and 16-bit and float logits
// one rounding from the exact gradient.
#include ETUDE_OPS_CATEGORY

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

// The backend runs the loss alone (weight 0) and then with the weight into one accumulator, and
// refuses (throws) unless the second sum doubles the first.
TEST_CASE(TEST_BACKEND_NAME ": softmax cross-entropy: loss, in-place gradients, ignored rows, weight 0", "[ops][loss]") {
  const index_t rows = 53, card = 300;
  std::mt19937 gen(80);
  std::uniform_int_distribution<int> tok(0, static_cast<int>(card) - 1);
  tokens target(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < target.size(); ++i) target[i] = i % 7 == 3 ? -1 : tok(gen);
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16})
    for (float weight : {0.25f, 0.0f}) {
      const vec logits = uniform(static_cast<std::size_t>(rows * card), -4, 4, 81, t);
      vec want = logits, got = logits;
      double loss = 0.0;
      cpu::softmax_xent(want.data(), target.data(), rows, card, &weight, &loss);
      const double got_loss = TEST_BACKEND::softmax_xent(t, got, target, rows, card, weight);
      // per row: lse in float (max, Σexp over card terms, log): <= (card + 4)·2^-24·(|lse| + 4) each
      CHECK(std::fabs(got_loss - loss) <= rows * (card + 4) * 0x1p-24 * 16);
      if (weight == 0.0f) {
        check_equal(got, logits, std::string("softmax_xent weight 0 leaves logits ") + name(t));
      } else {
        check_close(got, want, unit_roundoff(t) + 1e-5, 1e-7, std::string("softmax_xent grads ") + name(t));
        for (std::size_t r = 0; r < target.size(); ++r)
          if (target[r] < 0)
            for (index_t j = 0; j < card; ++j) CHECK(got[r * static_cast<std::size_t>(card) + static_cast<std::size_t>(j)] == 0.0f);
      }
      vec again = logits;
      CHECK(TEST_BACKEND::softmax_xent(t, again, target, rows, card, weight) == got_loss);  // deterministic sum
      CHECK(bit_identical(again, got));
    }
}

#ifdef TEST_BACKEND_CPU

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

#endif  // TEST_BACKEND_CPU
