// AdamW, written once for every backend (the category file ETUDE_OPS_CATEGORY names it:
// tests/ops/category_cpu.hpp in test_ops, category_cuda.hpp in test_gpu_ops and test_sim_ops): the
// update on an fp32 master with a bf16 working copy against the CPU in float, the skip flag, and the
// check naming the CPU's first refused value and writing nothing. On the CPU only: the update against
// PyTorch's formula written out in double, over three updates with weight decay, a gradient factor
// and bias corrections; the working copy; the check that refuses an update which would store a
// non-finite value, against the update itself, for any thread count and from the last update's range.
#include ETUDE_OPS_CATEGORY

#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include <etude/etude.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::backend::cpu_adamw;
using etude::index_t;
using namespace etude::test::ops;

// AdamW on an fp32 master with a bf16 working copy, f32 and bf16 gradients, two gradient factors.
TEST_CASE(TEST_BACKEND_NAME ": AdamW with fp32 master and a 16-bit working copy: the step's form, and the skip flag",
          "[ops][optim]") {
  const std::size_t n = 100003;
  etude::hyper h;
  h.beta2 = 0.95;
  h.weight_decay = 0.1;
  const auto adam = etude::optim::adamw::make_scalars(h, 1e-3, 7);
  for (dtype g : {dtype::f32, dtype::bf16})
    for (double gs : {0.8, 0.4}) {
      vec p = uniform(n, -1, 1, 100), m = uniform(n, -0.01f, 0.01f, 101), v = uniform(n, 0, 1e-4f, 102);
      const vec grad = uniform(n, -1, 1, 103, g);
      vec wp = p, wm = m, wv = v;
      const int go = 0;
      cpu::adamw_update(wp.data(), grad.data(), wm.data(), wv.data(), static_cast<index_t>(n), &adam, &gs, &go,
                        static_cast<float*>(nullptr));
      vec gp = p, gm = m, gv = v, gw;
      TEST_BACKEND::adamw(g, dtype::bf16, gp, grad, gm, gv, &gw, adam, gs, 0);
      // the same float formula; contraction into FMA moves a few ulp of the update (|Δp| <= ~lr·10)
      check_close(gp, wp, 1e-6, 1e-8, "adamw master");
      check_close(gm, wm, 1e-6, 1e-10, "adamw m");
      check_close(gv, wv, 1e-6, 1e-12, "adamw v");
      // the working copy is the new master rounded to bf16
      vec rounded = round_to(dtype::bf16, gp);
      check_equal(gw, rounded, "adamw working copy");
      // a skipped step changes nothing
      vec sp = p, sm = m, sv = v, sw;
      TEST_BACKEND::adamw(g, dtype::bf16, sp, grad, sm, sv, nullptr, adam, gs, 1);
      check_equal(sp, p, "skipped adamw master");
      check_equal(sm, m, "skipped adamw m");
      check_equal(sv, v, "skipped adamw v");
    }
}

TEST_CASE(TEST_BACKEND_NAME ": adamw_check names the same first refused value as the CPU's, and writes nothing",
          "[ops][optim]") {
  const std::size_t n = 100003;  // several blocks of the check's first pass
  const vec p = uniform(n, -1, 1, 120), m = uniform(n, -0.01f, 0.01f, 121), v = uniform(n, 0, 1e-4f, 122),
            g = uniform(n, -1, 1, 123);
  etude::hyper h;
  for (const refusal_variant& c : refusal_variants()) {
    INFO(c.what);
    vec cp = p, cg = g, cm = m, cv = v;
    c.edit(cp, cg, cm, cv);
    const auto sc = etude::optim::adamw::make_scalars(h, c.lr, 3);
    for (int skip : {0, 1}) {
      INFO("skip " << skip);
      etude::step_decision want{};
      want.grad_scale = 0.5;
      want.skip = skip;
      want.refused = -1;
      std::vector<etude::fp16> working(c.with_working ? n : 0);
      if (c.with_working)
        cpu::adamw_check(cp.data(), cg.data(), cm.data(), cv.data(), static_cast<index_t>(n), &sc, &want, working.data());
      else
        cpu::adamw_check(cp.data(), cg.data(), cm.data(), cv.data(), static_cast<index_t>(n), &sc, &want,
                         static_cast<const float*>(nullptr));
      const check_result got = TEST_BACKEND::adamw_check(dtype::f16, c.with_working, cp, cg, cm, cv, sc, 0.5, skip);
      CHECK(got.refused == want.refused);
      CHECK(got.skip == want.skip);
      CHECK(got.status == want.status);
      CHECK(got.unchanged);
    }
  }
}

#ifdef TEST_BACKEND_CPU

TEST_CASE("adamw_update follows PyTorch's AdamW", "[ops]") {
  etude::hyper h;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.eps = 1e-8;
  h.weight_decay = 0.1;
  const double lr = 1e-2, scale = 0.5;
  const index_t n = 37;
  auto p = random_vector(n, 51);
  std::vector<double> m(n, 0.0), v(n, 0.0), working(n);
  auto want_p = p, want_m = m, want_v = v;
  const int run = 0;
  for (long t = 1; t <= 3; ++t) {
    const auto g = random_vector(n, 52 + std::uint64_t(t));
    const auto sc = etude::optim::adamw::make_scalars(h, lr, t);
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, &sc, &scale, &run, working.data());
    for (index_t i = 0; i < n; ++i) {
      const double gi = g[i] * scale;
      want_p[i] *= 1 - lr * h.weight_decay;
      want_m[i] = h.beta1 * want_m[i] + (1 - h.beta1) * gi;
      want_v[i] = h.beta2 * want_v[i] + (1 - h.beta2) * gi * gi;
      const double mhat = want_m[i] / (1 - std::pow(h.beta1, double(t)));
      const double vhat = want_v[i] / (1 - std::pow(h.beta2, double(t)));
      want_p[i] -= lr * mhat / (std::sqrt(vhat) + h.eps);
    }
  }
  for (index_t i = 0; i < n; ++i) {
    CHECK(p[i] == Approx(want_p[i]).epsilon(1e-12));
    CHECK(m[i] == Approx(want_m[i]).epsilon(1e-12));
    CHECK(v[i] == Approx(want_v[i]).epsilon(1e-12));
    CHECK(working[i] == p[i]);
  }
}

TEST_CASE("adamw_update: the skip flag changes nothing; a bf16 working copy is the rounded master", "[ops]") {
  const index_t n = 20;
  const auto g = random_vector(n, 61);
  std::vector<float> p(n, 0.3f), m(n, 0.0f), v(n, 0.0f);
  std::vector<etude::bf16> working(n, etude::bf16(0.0f));
  const auto sc = etude::optim::adamw::make_scalars(etude::hyper{}, 1e-3, 1);
  const double scale = 1.0;
  const std::vector<float> grad(g.begin(), g.end());
  const int skip = 1, run = 0;
  cpu::adamw_update(p.data(), grad.data(), m.data(), v.data(), n, &sc, &scale, &skip, working.data());
  for (index_t i = 0; i < n; ++i) {
    CHECK(p[i] == 0.3f);
    CHECK(m[i] == 0.0f);
    CHECK(static_cast<float>(working[i]) == 0.0f);
  }
  cpu::adamw_update(p.data(), grad.data(), m.data(), v.data(), n, &sc, &scale, &run, working.data());
  for (index_t i = 0; i < n; ++i) {
    CHECK(p[i] != 0.3f);
    CHECK(working[i].bits == etude::bf16(p[i]).bits);
  }
}

namespace {
// A decision as step_control leaves it for a step that may update: finite, not skipped.
etude::step_decision running_decision(double grad_scale) {
  etude::step_decision d{};
  d.grad_scale = grad_scale;
  d.refused = -1;
  return d;
}

// The plain reference of adamw_check: run the update on copies and name the first value it stored
// that is not finite, in (element, what) order.
template <class P>
etude::index_t first_non_finite_stored(std::vector<float> p, const std::vector<float>& g, std::vector<float> m,
                                       std::vector<float> v, const etude::optim::adamw::scalars& sc, double scale,
                                       bool with_working) {
  const auto n = static_cast<index_t>(p.size());
  std::vector<P> working(p.size(), P(0.0f));
  const int run = 0;
  cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, &sc, &scale, &run,
                    with_working ? working.data() : nullptr);
  for (index_t i = 0; i < n; ++i) {
    const auto u = static_cast<std::size_t>(i);
    if (!std::isfinite(m[u])) return etude::update_value_key(i, etude::update_value_state0);
    if (!std::isfinite(v[u])) return etude::update_value_key(i, etude::update_value_state1);
    if (!std::isfinite(p[u])) return etude::update_value_key(i, etude::update_value_weight);
    if (with_working && !std::isfinite(static_cast<float>(working[u])))
      return etude::update_value_key(i, etude::update_value_working);
  }
  return -1;
}
}  // namespace

TEST_CASE("adamw_check refuses exactly the updates that would store a non-finite value, naming the first", "[ops]") {
  const index_t n = 41;
  const auto rp = random_vector(n, 91), rg = random_vector(n, 92), rm = random_vector(n, 93, 0.1),
             rv = random_vector(n, 94, 0.01);
  struct variant {
    const char* what;
    double lr;
    std::function<void(std::vector<float>&, std::vector<float>&, std::vector<float>&, std::vector<float>&)> edit;
    etude::index_t want;  // the key the check must report, -1 for none
    bool fp16_working = false;
  };
  const std::vector<variant> variants = {
      {"a sane learning rate", 1e-3, [](auto&, auto&, auto&, auto&) {}, -1},
      {"lr 1e38: every weight", 1e38, [](auto&, auto&, auto&, auto&) {},
       etude::update_value_key(0, etude::update_value_weight)},
      {"one huge finite gradient: only exp_avg_sq", 1e-3, [](auto&, auto& g, auto&, auto&) { g[17] = g[30] = 1e20f; },
       etude::update_value_key(17, etude::update_value_state1)},
      {"exp_avg and exp_avg_sq of one element: exp_avg, computed first, is named", 1e-3,
       [&](auto&, auto& g, auto& m, auto&) {
         g[8] = 2e38f;  // g − m overflows, and so does g²
         m[8] = -2e38f;
       },
       etude::update_value_key(8, etude::update_value_state0)},
      {"an earlier element comes first, whatever its value", 1e-3,
       [&](auto&, auto& g, auto& m, auto&) {
         g[29] = 2e38f;
         m[29] = -2e38f;
         g[5] = 1e20f;
       },
       etude::update_value_key(5, etude::update_value_state1)},
      {"a weight the first pass cannot clear (huge m, huge v) is decided exactly: finite", 1e-3,
       [](auto&, auto&, auto& m, auto& v) {
         m[12] = 1e35f;
         v[12] = 3e38f;
       },
       -1},
      {"a negative second moment (corrupt state): the weight becomes NaN", 1e-3,
       [](auto&, auto&, auto&, auto& v) { v[7] = -1.0f; }, etude::update_value_key(7, etude::update_value_weight)},
      {"an fp16 working copy above 65504 while the fp32 master is finite", 1e-3,
       [](auto& p, auto&, auto&, auto&) { p[3] = 7e4f; }, etude::update_value_key(3, etude::update_value_working),
       true},
  };
  etude::hyper h;
  for (const variant& c : variants) {
    INFO(c.what);
    std::vector<float> p(rp.begin(), rp.end()), g(rg.begin(), rg.end()), m(rm.begin(), rm.end()), v(n);
    for (index_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(std::fabs(rv[i]));
    c.edit(p, g, m, v);
    const auto sc = etude::optim::adamw::make_scalars(h, c.lr, 3);
    const double scale = 1.0;
    const etude::index_t reference = c.fp16_working
                                         ? first_non_finite_stored<etude::fp16>(p, g, m, v, sc, scale, true)
                                         : first_non_finite_stored<float>(p, g, m, v, sc, scale, false);
    CHECK(reference == c.want);
    const auto p0 = p, m0 = m, v0 = v;
    etude::step_decision d = running_decision(scale);
    std::vector<etude::fp16> working(p.size(), etude::fp16(0.0f));
    if (c.fp16_working)
      cpu::adamw_check(p.data(), g.data(), m.data(), v.data(), n, &sc, &d, working.data());
    else
      cpu::adamw_check(p.data(), g.data(), m.data(), v.data(), n, &sc, &d, static_cast<const float*>(nullptr));
    CHECK(d.refused == c.want);
    CHECK(d.skip == (c.want >= 0 ? 1 : 0));
    CHECK(d.status == (c.want >= 0 ? etude::step_update_not_finite : 0));
    CHECK(p == p0);  // nothing written
    CHECK(m == m0);
    CHECK(v == v0);
    CHECK(static_cast<float>(working[0]) == 0.0f);
    // a decision that already skips is left alone
    etude::step_decision skipped = running_decision(scale);
    skipped.skip = 1;
    skipped.status = etude::step_grads_not_finite;
    cpu::adamw_check(p.data(), g.data(), m.data(), v.data(), n, &sc, &skipped, static_cast<const float*>(nullptr));
    CHECK(skipped.refused == -1);
    CHECK(skipped.status == etude::step_grads_not_finite);
  }
}

TEST_CASE("adamw_check: the first refused value does not depend on the thread count", "[ops]") {
  // a tensor larger than one thread's share, with offenders in the second half and late in the first
  const index_t n = 100003;
  const auto r = random_vector(n, 95);
  std::vector<float> p(r.begin(), r.end()), g(p), m(n, 0.0f), v(n, 0.0f);
  g[70001] = g[50000] = g[99999] = 1e20f;
  const auto sc = etude::optim::adamw::make_scalars(etude::hyper{}, 1e-3, 1);
  for (int threads : {1, 2, 3, 7}) {
    INFO(threads << " threads");
    const int keep = omp_get_max_threads();
    omp_set_num_threads(threads);
    etude::step_decision d = running_decision(1.0);
    cpu::adamw_check(p.data(), g.data(), m.data(), v.data(), n, &sc, &d, static_cast<const float*>(nullptr));
    omp_set_num_threads(keep);
    CHECK(d.refused == etude::update_value_key(50000, etude::update_value_state1));
  }
}

namespace {
// What a range must say of the values it describes: their largest magnitudes and smallest values.
void check_range_of(const etude::optim::update_range& r, const std::vector<float>& p, const std::vector<float>& m,
                    const std::vector<float>& v) {
  auto max_abs = [](const std::vector<float>& x) {
    double top = 0.0;
    for (float e : x) top = std::max(top, static_cast<double>(std::fabs(e)));
    return top;
  };
  auto min_of = [](const std::vector<float>& x) { return static_cast<double>(*std::min_element(x.begin(), x.end())); };
  CHECK(r.known);
  CHECK(r.weight == max_abs(p));
  CHECK(r.state_max[0] == max_abs(m));
  CHECK(r.state_max[1] == max_abs(v));
  CHECK(r.second_min == min_of(v));
}

double sum_of_squares(const std::vector<float>& g) {
  double s = 0.0;
  for (float x : g) s += static_cast<double>(x) * static_cast<double>(x);
  return s;
}
}  // namespace

TEST_CASE("adamw_update records the range of what it stored, the same bits as without it", "[ops]") {
  const index_t n = 5003;  // several runs of the update's loop, the last a partial one
  const auto rp = random_vector(n, 71), rg = random_vector(n, 72);
  const auto sc = etude::optim::adamw::make_scalars(etude::hyper{}, 1e-2, 2);
  const double scale = 0.7;
  const int run = 0, skip = 1;
  for (int threads : {1, 3}) {
    INFO(threads << " threads");
    const int keep = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> p(rp.begin(), rp.end()), g(rg.begin(), rg.end()), m(g), v(n, 0.25f);
    auto p2 = p, m2 = m, v2 = v;
    std::vector<etude::bf16> working(p.size()), working2(p.size());
    etude::optim::update_range range;
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, &sc, &scale, &run, working.data(), &range);
    cpu::adamw_update(p2.data(), g.data(), m2.data(), v2.data(), n, &sc, &scale, &run, working2.data());
    omp_set_num_threads(keep);
    CHECK(p == p2);
    CHECK(m == m2);
    CHECK(v == v2);
    CHECK(std::memcmp(working.data(), working2.data(), working.size() * sizeof(etude::bf16)) == 0);
    check_range_of(range, p, m, v);
    // a skipped update writes nothing, the range included
    const etude::optim::update_range kept = range;
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, &sc, &scale, &skip, working.data(), &range);
    CHECK(std::memcmp(&kept, &range, sizeof range) == 0);
  }
  // an update run without its check that stores a NaN (a negative second moment) leaves it unknown
  std::vector<float> p(rp.begin(), rp.end()), g(rg.begin(), rg.end()), m(n, 0.0f), v(n, 0.0f);
  v[4000] = -1.0f;
  etude::optim::update_range range;
  cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, &sc, &scale, &run,
                    static_cast<float*>(nullptr), &range);
  CHECK(std::isnan(p[4000]));
  CHECK_FALSE(range.known);
}

TEST_CASE("adamw_check from the last update's range decides as the passes over the elements do", "[ops]") {
  // one update leaves the state and its range; the next update's check, from that range and the
  // gradients' sum of squares, against the check that reads every element, over gradients and
  // learning rates from ordinary to overflowing, with a float and an fp16 working copy
  const index_t n = 257;
  const auto rp = random_vector(n, 81), rg = random_vector(n, 82);
  etude::hyper h;
  const int run = 0;
  int decided_from_range = 0, refused = 0;
  for (const bool fp16_working : {false, true}) {
    for (const double lr : {1e-3, 1.0, 1e3, 1e30, 1e38}) {
      for (const float huge : {0.0f, 1e3f, 1e18f, 1e19f, 1e20f, 3e38f}) {
        INFO("fp16 working copy " << fp16_working << ", lr " << lr << ", a gradient of " << huge);
        std::vector<float> p(rp.begin(), rp.end()), g(rg.begin(), rg.end()), m(n, 0.0f), v(n, 0.0f);
        std::vector<etude::fp16> w16(p.size());
        if (fp16_working) p[9] = 6e4f;  // near fp16's largest: a learning rate of 1e3 or more overflows the copy
        const auto sc1 = etude::optim::adamw::make_scalars(h, 1e-3, 1);
        const auto sc2 = etude::optim::adamw::make_scalars(h, lr, 2);
        const double scale = 1.0;
        etude::optim::update_range range;
        if (fp16_working)
          cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, &sc1, &scale, &run, w16.data(), &range);
        else
          cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, &sc1, &scale, &run,
                            static_cast<float*>(nullptr), &range);
        REQUIRE(range.known);
        if (huge != 0.0f) g[200] = huge;
        etude::step_decision full = running_decision(scale), quick = running_decision(scale);
        full.sum_squares = quick.sum_squares = sum_of_squares(g);
        if (fp16_working) {
          cpu::adamw_check(p.data(), g.data(), m.data(), v.data(), n, &sc2, &full, w16.data());
          cpu::adamw_check(p.data(), g.data(), m.data(), v.data(), n, &sc2, &quick, w16.data(), &range);
        } else {
          cpu::adamw_check(p.data(), g.data(), m.data(), v.data(), n, &sc2, &full, static_cast<const float*>(nullptr));
          cpu::adamw_check(p.data(), g.data(), m.data(), v.data(), n, &sc2, &quick, static_cast<const float*>(nullptr),
                           &range);
        }
        CHECK(quick.refused == full.refused);
        CHECK(quick.skip == full.skip);
        CHECK(quick.status == full.status);
        refused += full.skip;
        const cpu_adamw::coefficients<float> c(sc2, scale);
        const double limit = 0.5 * (fp16_working ? etude::dtype_traits<etude::fp16>::max_finite
                                                 : etude::dtype_traits<float>::max_finite);
        const bool from_range = cpu_adamw::within_range<float>(range, c, full.sum_squares, limit);
        decided_from_range += from_range ? 1 : 0;
        if (from_range) CHECK(full.skip == 0);  // what the range clears, the element passes clear too
      }
    }
  }
  // both paths were taken: ordinary steps decided from the range, overflowing ones refused
  CHECK(decided_from_range >= 12);
  CHECK(refused >= 12);
  // an unknown range, or one whose second moment went negative, decides nothing
  etude::optim::update_range unknown;
  const cpu_adamw::coefficients<float> c(etude::optim::adamw::make_scalars(h, 1e-3, 2), 1.0);
  CHECK_FALSE(cpu_adamw::within_range<float>(unknown, c, 1.0, 1e38));
  etude::optim::update_range negative{.known = true, .weight = 1.0, .state_max = {1.0, 1.0}, .second_min = -1e-30};
  CHECK_FALSE(cpu_adamw::within_range<float>(negative, c, 1.0, 1e38));
  negative.second_min = 0.0;
  CHECK(cpu_adamw::within_range<float>(negative, c, 1.0, 1e38));
  // a range that clears the update is believed, elements unread: one that does not describe the
  // state (here a negative second moment the full check refuses) lets the update through, which is
  // why the trainer forgets the range when the host writes
  std::vector<float> p(rp.begin(), rp.end()), g(rg.begin(), rg.end()), m(n, 0.0f), v(n, 0.0f);
  v[7] = -1.0f;
  const auto sc = etude::optim::adamw::make_scalars(h, 1e-3, 2);
  etude::step_decision full = running_decision(1.0), believed = running_decision(1.0);
  full.sum_squares = believed.sum_squares = sum_of_squares(g);
  const etude::optim::update_range stale{.known = true, .weight = 1.0, .state_max = {0.0, 0.0}, .second_min = 0.0};
  cpu::adamw_check(p.data(), g.data(), m.data(), v.data(), n, &sc, &full, static_cast<const float*>(nullptr));
  cpu::adamw_check(p.data(), g.data(), m.data(), v.data(), n, &sc, &believed, static_cast<const float*>(nullptr),
                   &stale);
  CHECK(full.refused == etude::update_value_key(7, etude::update_value_weight));
  CHECK(believed.refused == -1);
  CHECK(believed.skip == 0);
}

#endif  // TEST_BACKEND_CPU
