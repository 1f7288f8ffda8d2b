// Step control, written once for every backend (the category file ETUDE_OPS_CATEGORY names it:
// tests/ops/category_cpu.hpp in test_ops, category_cuda.hpp in test_gpu_ops and test_sim_ops): the
// gradient factor from the sum of squares, the clip norm and the loss scale. On the CPU only:
// clipping, non-finite losses and gradients skipping the update, clear_unless.
#include ETUDE_OPS_CATEGORY

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include <etude/etude.hpp>

using cpu = etude::backend::cpu;

TEST_CASE(TEST_BACKEND_NAME ": step_control's gradient factor", "[ops][optim]") {
  // inv_ls · min(1, max_norm / (norm + 1e-6)), norm = sqrt(ss)·inv_ls
  CHECK(TEST_BACKEND::clip_scale(16.0, 1.0f, 1.0f) == Approx(1.0 / (4.0 + 1e-6)).epsilon(1e-6));
  CHECK(TEST_BACKEND::clip_scale(0.25, 1.0f, 0.5f) == 0.5f);
  CHECK(TEST_BACKEND::clip_scale(64.0 * 1024.0 * 1024.0, 1.0f, 1.0f / 1024.0f) ==
        Approx((1.0 / 1024.0) / (8.0 + 1e-6)).epsilon(1e-6));
}

#ifdef TEST_BACKEND_CPU

namespace {
etude::step_decision decide(double sum_squares, double clip, double loss_scale, double loss) {
  etude::step_limits in{};
  in.clip_norm = clip;
  in.loss_scale = loss_scale;
  in.loss_scaled = loss_scale != 1.0 ? 1 : 0;
  etude::step_decision out{};
  out.sum_squares = sum_squares;
  const double losses[2] = {1.0, loss};
  cpu::step_control(&in, losses, 2, &out);
  return out;
}
}  // namespace

TEST_CASE("step_control: clipping and the gradient factor", "[ops]") {
  // norm 5 at loss scale 1, clipped to 1: coefficient 1 / (5 + 1e-6)
  auto d = decide(25.0, 1.0, 1.0, 2.0);
  CHECK(d.status == 0);
  CHECK(d.skip == 0);
  CHECK(d.clip_coef == Approx(1.0 / (5.0 + 1e-6)).epsilon(1e-15));
  CHECK(d.grad_scale == Approx(d.clip_coef).epsilon(1e-15));
  // below the limit, and with clipping off, no clipping; the loss scale divides out
  d = decide(25.0 * 64.0 * 64.0, 10.0, 64.0, 2.0);
  CHECK(d.clip_coef == 1.0);
  CHECK(d.grad_scale == Approx(1.0 / 64.0).epsilon(1e-15));
  d = decide(1e6, 0.0, 1.0, 2.0);
  CHECK(d.clip_coef == 1.0);
}

TEST_CASE("step_control: non-finite losses and gradients skip the update", "[ops]") {
  const double inf = std::numeric_limits<double>::infinity();
  auto d = decide(1.0, 1.0, 1.0, std::nan(""));
  CHECK(d.status == etude::step_loss_not_finite);
  CHECK(d.skip != 0);
  CHECK(d.keep != 0);  // an error: the gradients stay for the report
  d = decide(inf, 1.0, 1024.0, 2.0);  // overflow under loss scaling: skip, clear, go on
  CHECK(d.status == etude::step_grads_not_finite);
  CHECK(d.skip != 0);
  CHECK(d.keep == 0);
  d = decide(inf, 1.0, 1.0, 2.0);  // unscaled: an error, the gradients kept
  CHECK(d.keep != 0);
}

TEST_CASE("clear_unless zeroes unless told to keep", "[ops]") {
  std::vector<float> x(10, 2.0f);
  const int keep = 1, clear = 0;
  cpu::clear_unless(x.data(), 10, &keep);
  CHECK(x[9] == 2.0f);
  cpu::clear_unless(x.data(), 10, &clear);
  CHECK(x == std::vector<float>(10, 0.0f));
}

#endif  // TEST_BACKEND_CPU
