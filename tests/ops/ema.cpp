// The EMA of the weights (ops/ema.hpp), written once for every backend (ETUDE_OPS_CATEGORY): five
// updates with AudioCraft's unbiased weights (count ← count·decay + 1, w = 1/count) against the
// closed form Σ decay^(T−s)·p_s / Σ decay^(T−s) in double; the first update copying the weights
// exactly; and the skip flag, or a weight of 0 (a step between two EMA updates), leaving the averages
// bit for bit as they were.
#include ETUDE_OPS_CATEGORY

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <etude/etude.hpp>

#include "ops/oracle.hpp"

using namespace etude::test::ops;

TEST_CASE(TEST_BACKEND_NAME ": EMA of the weights against its closed form, the first update a copy, skip and weight 0",
          "[ops][ema]") {
  const std::size_t n = 100003;  // several blocks and a ragged end
  const double decay = 0.9;
  const int updates = 5;
  std::vector<vec> weights;
  for (int s = 0; s < updates; ++s) weights.push_back(uniform(n, -1, 1, 300 + static_cast<std::uint32_t>(s)));

  vec e = uniform(n, -5, 5, 299);  // whatever it held: the first update's weight is 1
  double count = 0;
  for (int s = 0; s < updates; ++s) {
    count = count * decay + 1;
    TEST_BACKEND::ema(e, weights[static_cast<std::size_t>(s)], 1.0 / count, 0);
    if (s == 0) check_equal(e, weights[0], "the first EMA update");
  }
  vec want(n);
  for (std::size_t i = 0; i < n; ++i) {
    double num = 0, den = 0;
    for (int s = 0; s < updates; ++s) {
      const double d = std::pow(decay, updates - 1 - s);
      num += d * weights[static_cast<std::size_t>(s)][i];
      den += d;
    }
    want[i] = static_cast<float>(num / den);
  }
  // each update rounds twice in float (the difference, the sum) after a weight rounded once
  check_close(e, want, 4e-7 * updates, 1e-7, "the EMA after five updates");

  const vec before = e;
  TEST_BACKEND::ema(e, weights[0], 0.5, 1);
  check_equal(e, before, "a skipped EMA update");
  TEST_BACKEND::ema(e, weights[1], 0.0, 0);
  check_equal(e, before, "an EMA update of weight 0");
}
