// The reductions on the CPU: the sum of squares against a double sum, its determinism, and the
// finiteness check.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include <etude/etude.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

TEST_CASE("sum of squares is deterministic and exact enough", "[ops]") {
  std::vector<float> v(100003);
  etude::rng r(15);
  double ref = 0;
  for (auto& x : v) {
    x = static_cast<float>(r.uniform(-1, 1));
    ref += double(x) * x;
  }
  double a = -7.0, b = 3.0;  // written, not added to
  cpu::sum_squares(v.data(), static_cast<index_t>(v.size()), &a);
  cpu::sum_squares(v.data(), static_cast<index_t>(v.size()), &b);
  CHECK(a == b);
  CHECK(a == Approx(ref).epsilon(1e-12));
  double none = 5.0;
  cpu::sum_squares(v.data(), 0, &none);
  CHECK(none == 0.0);
}

TEST_CASE("all_finite finds a NaN or an infinity anywhere, in every dtype", "[ops]") {
  std::vector<float> f(9000, 1.0f);
  CHECK(cpu::all_finite(f.data(), index_t(f.size())));
  f[8999] = std::numeric_limits<float>::infinity();
  CHECK_FALSE(cpu::all_finite(f.data(), index_t(f.size())));
  CHECK(cpu::all_finite(f.data(), 8999));
  std::vector<etude::bf16> h(100, etude::bf16(2.0f));
  CHECK(cpu::all_finite(h.data(), 100));
  h[3] = etude::bf16(std::nanf(""));
  CHECK_FALSE(cpu::all_finite(h.data(), 100));
  std::vector<etude::fp16> p(10, etude::fp16(70000.0f));  // beyond fp16's range: rounds to infinity
  CHECK_FALSE(cpu::all_finite(p.data(), 10));
}
