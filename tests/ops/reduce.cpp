// The reductions, written once for every backend (the category file ETUDE_OPS_CATEGORY names it:
// tests/ops/category_cpu.hpp in test_ops, category_cuda.hpp in test_gpu_ops and test_sim_ops): the
// sum of squares in f32, bf16 and fp16 against the CPU's double sum, written over a stale value, the
// same bits twice, and the finiteness check. On the CPU only: the sum against a plain double sum, and
// all_finite on lengths that end before the bad value.
#include ETUDE_OPS_CATEGORY

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>
#include <etude/core/rng.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

TEST_CASE(TEST_BACKEND_NAME ": sum of squares and finiteness", "[ops][reduce]") {
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16}) {
    const vec x = uniform(1234567, -2, 2, 90, t);  // several chunks and a ragged end
    double want = 0.0;
    cpu::sum_squares(x.data(), static_cast<index_t>(x.size()), &want);
    const double got = TEST_BACKEND::sum_squares(t, x);
    CHECK(std::fabs(got - want) <= 1e-12 * want);  // double sums of n terms in two orders
    CHECK(TEST_BACKEND::sum_squares(t, x) == got);  // fixed order: the same bits
    CHECK(TEST_BACKEND::all_finite(t, x));
    vec bad = x;
    bad[777777] = std::numeric_limits<float>::infinity();
    CHECK_FALSE(TEST_BACKEND::all_finite(t, bad));
    bad = x;
    bad[1234566] = std::numeric_limits<float>::quiet_NaN();
    CHECK_FALSE(TEST_BACKEND::all_finite(t, bad));
  }
  CHECK(TEST_BACKEND::sum_squares(dtype::f32, vec{}) == 0.0);
}

#ifdef TEST_BACKEND_CPU

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

#endif  // TEST_BACKEND_CPU
