// SGD with momentum, written once for every backend (the category file ETUDE_OPS_CATEGORY names it:
// tests/ops/category_cpu.hpp in test_ops, category_cuda.hpp in test_gpu_ops and test_sim_ops): the
// update against the CPU in float, plain and Nesterov, the skip flag, and the check naming the CPU's
// first refused value and writing nothing. On the CPU only: the update against PyTorch's formula in
// double, the check against the update itself, and the range of what the update stored.
#include ETUDE_OPS_CATEGORY

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include <etude/etude.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::backend::cpu_sgd;
using etude::index_t;
using namespace etude::test::ops;

TEST_CASE(TEST_BACKEND_NAME ": SGD, plain and Nesterov, first update or not: the step's form, and the skip flag",
          "[ops][optim]") {
  for (bool nesterov : {false, true})
    for (bool first : {false, true}) {
      const etude::optim::sgd_scalars sc{0.01, 0.9, 0.1, nesterov ? 1 : 0, first ? 1 : 0};
      vec p = uniform(5000, -1, 1, 110), buf = uniform(5000, -1, 1, 111);
      const vec grad = uniform(5000, -1, 1, 112);
      vec wp = p, wb = buf;
      const double gs = 0.5;
      const int go = 0;
      cpu::sgd_update(wp.data(), grad.data(), wb.data(), 5000, &sc, &gs, &go, static_cast<float*>(nullptr));
      TEST_BACKEND::sgd(p, grad, buf, sc, gs, 0);
      check_close(p, wp, 1e-6, 1e-7, "sgd p");
      check_close(buf, wb, 1e-6, 1e-7, "sgd buf");
      vec sp = p, sb = buf;
      TEST_BACKEND::sgd(sp, grad, sb, sc, gs, 1);
      check_equal(sp, p, "skipped sgd p");
      check_equal(sb, buf, "skipped sgd buf");
    }
}

// the inputs of AdamW's check, the moments m as SGD's buffer
TEST_CASE(TEST_BACKEND_NAME ": sgd_check names the same first refused value as the CPU's, and writes nothing",
          "[ops][optim]") {
  const std::size_t n = 100003;  // several blocks of the check's first pass
  const vec p = uniform(n, -1, 1, 120), m = uniform(n, -0.01f, 0.01f, 121), v = uniform(n, 0, 1e-4f, 122),
            g = uniform(n, -1, 1, 123);
  for (const refusal_variant& c : refusal_variants()) {
    INFO(c.what);
    vec cp = p, cg = g, cm = m, cv = v;
    c.edit(cp, cg, cm, cv);
    const etude::optim::sgd_scalars ss{c.lr > 1 ? 1e39 : 0.01, 0.9, 0.1, 1, 0};
    etude::step_decision want{};
    want.grad_scale = 0.5;
    want.refused = -1;
    std::vector<etude::fp16> working(c.with_working ? n : 0);
    if (c.with_working)
      cpu::sgd_check(cp.data(), cg.data(), cm.data(), static_cast<index_t>(n), &ss, &want, working.data());
    else
      cpu::sgd_check(cp.data(), cg.data(), cm.data(), static_cast<index_t>(n), &ss, &want,
                     static_cast<const float*>(nullptr));
    const check_result got = TEST_BACKEND::sgd_check(dtype::f16, c.with_working, cp, cg, cm, ss, 0.5, 0);
    CHECK(got.refused == want.refused);
    CHECK(got.status == want.status);
    CHECK(got.unchanged);
  }
}

#ifdef TEST_BACKEND_CPU

TEST_CASE("sgd_update follows PyTorch's SGD with momentum, plain and Nesterov", "[ops]") {
  for (int nesterov : {0, 1}) {
    INFO("nesterov " << nesterov);
    const index_t n = 29;
    const double lr = 0.05, mu = 0.9, wd = 0.01, scale = 0.25;
    auto p = random_vector(n, 71);
    std::vector<double> buf(n, 123.0), working(n);  // the first update ignores the buffer's contents
    auto want_p = p, want_buf = buf;
    const int run = 0;
    for (int t = 1; t <= 3; ++t) {
      const auto g = random_vector(n, 72 + std::uint64_t(t));
      const etude::optim::sgd_scalars sc{lr, mu, wd, nesterov, t == 1};
      cpu::sgd_update(p.data(), g.data(), buf.data(), n, &sc, &scale, &run, working.data());
      for (index_t i = 0; i < n; ++i) {
        const double gi = g[i] * scale + wd * want_p[i];
        want_buf[i] = t == 1 ? gi : mu * want_buf[i] + gi;
        want_p[i] -= lr * (nesterov ? gi + mu * want_buf[i] : want_buf[i]);
      }
    }
    for (index_t i = 0; i < n; ++i) {
      CHECK(p[i] == Approx(want_p[i]).epsilon(1e-13));
      CHECK(buf[i] == Approx(want_buf[i]).epsilon(1e-13));
      CHECK(working[i] == p[i]);
    }
    const auto before = p;
    const int skip = 1;
    const etude::optim::sgd_scalars sc{lr, mu, wd, nesterov, 0};
    const auto g = random_vector(n, 80);
    cpu::sgd_update(p.data(), g.data(), buf.data(), n, &sc, &scale, &skip, working.data());
    CHECK(p == before);
  }
}

namespace {
// The plain reference of sgd_check: the update on copies, the first stored value that is not
// finite in (element, what) order.
template <class P>
etude::index_t first_non_finite_stored(std::vector<float> p, const std::vector<float>& g, std::vector<float> buf,
                                       const etude::optim::sgd_scalars& sc, bool with_working) {
  const auto n = static_cast<index_t>(p.size());
  std::vector<P> working(p.size(), P(0.0f));
  const double scale = 1.0;
  const int run = 0;
  cpu::sgd_update(p.data(), g.data(), buf.data(), n, &sc, &scale, &run, with_working ? working.data() : nullptr);
  for (index_t i = 0; i < n; ++i) {
    const auto u = static_cast<std::size_t>(i);
    if (!std::isfinite(buf[u])) return etude::update_value_key(i, etude::update_value_state0);
    if (!std::isfinite(p[u])) return etude::update_value_key(i, etude::update_value_weight);
    if (with_working && !std::isfinite(static_cast<float>(working[u])))
      return etude::update_value_key(i, etude::update_value_working);
  }
  return -1;
}
}  // namespace

TEST_CASE("sgd_check refuses exactly the updates that would store a non-finite value, naming the first", "[ops]") {
  const index_t n = 33;
  const auto rp = random_vector(n, 96), rg = random_vector(n, 97), rb = random_vector(n, 98);
  struct variant {
    const char* what;
    double lr;
    int first;
    void (*edit)(std::vector<float>& p, std::vector<float>& g, std::vector<float>& buf);
    etude::index_t want;
    bool fp16_working;
  };
  const variant variants[] = {
      {"a sane learning rate", 0.05, 0, [](auto&, auto&, auto&) {}, -1, false},
      {"lr 1e39 (infinite in float): every weight", 1e39, 0, [](auto&, auto&, auto&) {},
       etude::update_value_key(0, etude::update_value_weight), false},
      {"the momentum buffer", 0.05, 0, [](auto&, auto& g, auto& buf) { g[11] = buf[11] = 3e38f; },
       etude::update_value_key(11, etude::update_value_state0), false},
      {"the first update ignores the old buffer", 0.05, 1, [](auto&, auto&, auto& buf) { buf[11] = 3e38f; }, -1,
       false},
      {"an fp16 working copy above 65504", 0.05, 0, [](auto& p, auto&, auto&) { p[20] = 7e4f; },
       etude::update_value_key(20, etude::update_value_working), true},
  };
  for (const variant& c : variants) {
    INFO(c.what);
    for (int nesterov : {0, 1}) {
      INFO("nesterov " << nesterov);
      std::vector<float> p(rp.begin(), rp.end()), g(rg.begin(), rg.end()), buf(rb.begin(), rb.end());
      c.edit(p, g, buf);
      const etude::optim::sgd_scalars sc{c.lr, 0.9, 0.01, nesterov, c.first};
      CHECK((c.fp16_working ? first_non_finite_stored<etude::fp16>(p, g, buf, sc, true)
                            : first_non_finite_stored<float>(p, g, buf, sc, false)) == c.want);
      const auto p0 = p, b0 = buf;
      etude::step_decision d{};
      d.grad_scale = 1.0;
      d.refused = -1;
      std::vector<etude::fp16> working(p.size(), etude::fp16(0.0f));
      if (c.fp16_working)
        cpu::sgd_check(p.data(), g.data(), buf.data(), n, &sc, &d, working.data());
      else
        cpu::sgd_check(p.data(), g.data(), buf.data(), n, &sc, &d, static_cast<const float*>(nullptr));
      CHECK(d.refused == c.want);
      CHECK(d.skip == (c.want >= 0 ? 1 : 0));
      CHECK(d.status == (c.want >= 0 ? etude::step_update_not_finite : 0));
      CHECK(p == p0);
      CHECK(buf == b0);
    }
  }
}

TEST_CASE("sgd_update records the range of what it stored; sgd_check from it decides as the full check", "[ops]") {
  // one update leaves the state and its range; the next check from that range and the gradients'
  // sum of squares against the full check, over learning rates and gradients up to overflowing
  const index_t n = 3001;
  const auto rp = random_vector(n, 101), rg = random_vector(n, 102);
  const double scale = 1.0;
  const int run = 0;
  int decided_from_range = 0, refused = 0;
  for (int nesterov : {0, 1}) {
    for (const double lr : {0.05, 1e3, 1e30, 1e38}) {
      for (const float huge : {0.0f, 1e10f, 1e30f, 3e38f}) {
        INFO("nesterov " << nesterov << ", lr " << lr << ", a gradient of " << huge);
        std::vector<float> p(rp.begin(), rp.end()), g(rg.begin(), rg.end()), buf(n, 0.0f);
        std::vector<etude::bf16> working(p.size()), plain(p.size());
        const etude::optim::sgd_scalars first{0.05, 0.9, 0.01, nesterov, 1}, next{lr, 0.9, 0.01, nesterov, 0};
        auto p2 = p, buf2 = buf;
        etude::optim::update_range range;
        cpu::sgd_update(p.data(), g.data(), buf.data(), n, &first, &scale, &run, working.data(), &range);
        cpu::sgd_update(p2.data(), g.data(), buf2.data(), n, &first, &scale, &run, plain.data());
        REQUIRE(p == p2);  // the same bits with the range recorded
        REQUIRE(buf == buf2);
        REQUIRE(range.known);
        double p_max = 0.0, b_max = 0.0;
        for (index_t i = 0; i < n; ++i) {
          p_max = std::max(p_max, double(std::fabs(p[std::size_t(i)])));
          b_max = std::max(b_max, double(std::fabs(buf[std::size_t(i)])));
        }
        CHECK(range.weight == p_max);
        CHECK(range.state_max[0] == b_max);
        if (huge != 0.0f) g[2500] = huge;
        double ss = 0.0;
        for (float x : g) ss += double(x) * double(x);
        etude::step_decision full{}, quick{};
        full.grad_scale = quick.grad_scale = scale;
        full.refused = quick.refused = -1;
        full.sum_squares = quick.sum_squares = ss;
        cpu::sgd_check(p.data(), g.data(), buf.data(), n, &next, &full, working.data());
        cpu::sgd_check(p.data(), g.data(), buf.data(), n, &next, &quick, working.data(), &range);
        CHECK(quick.refused == full.refused);
        CHECK(quick.skip == full.skip);
        CHECK(quick.status == full.status);
        refused += full.skip;
        const cpu_sgd::coefficients<float> c(next, scale);
        decided_from_range += cpu_sgd::within_range<float>(range, c, ss, 0.5 * 0x1.fep127) ? 1 : 0;
      }
    }
  }
  CHECK(decided_from_range >= 8);
  CHECK(refused >= 8);
  // a range that clears the update is believed, elements unread (as for AdamW): here one that
  // hides a momentum buffer the full check refuses
  std::vector<float> p(rp.begin(), rp.end()), g(rg.begin(), rg.end()), buf(n, 0.0f);
  g[11] = buf[11] = 3e38f;
  const etude::optim::sgd_scalars sc{0.05, 0.9, 0.0, 0, 0};
  etude::step_decision full{}, believed{};
  full.refused = believed.refused = -1;
  full.sum_squares = believed.sum_squares = 1.0;  // what the range's lie needs: ordinary gradients
  const etude::optim::update_range stale{.known = true, .weight = 1.0, .state_max = {1.0, 0.0}};
  cpu::sgd_check(p.data(), g.data(), buf.data(), n, &sc, &full, static_cast<const float*>(nullptr));
  cpu::sgd_check(p.data(), g.data(), buf.data(), n, &sc, &believed, static_cast<const float*>(nullptr), &stale);
  CHECK(full.refused == etude::update_value_key(11, etude::update_value_state0));
  CHECK(believed.refused == -1);
}

#endif  // TEST_BACKEND_CPU
