// Mixed precision on the CPU: bf16 and fp16 policies store their tensors rounded to nearest even
// and compute in float, so their numerics are tested here, not only on a GPU. The fp16 loss
// scaler skips exactly the steps whose gradients overflow.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <etude/data/synthetic.hpp>
#include <etude/etude.hpp>

#include "../support.hpp"

namespace {

constexpr etude::shape shape{.codebooks = 4, .card = 64, .dim = 64, .heads = 4, .layers = 2, .max_len = 128};
using lm = etude::model<shape, etude::pattern::delay<0, 1, 2, 3>>;
namespace pr = etude::precision;

const etude::data::synthetic_tokens& corpus() {
  static const etude::data::synthetic_tokens c{
      {.codebooks = 4, .card = 64, .states = 16, .branching = 2, .repeat = 0.0, .period = 8, .fine_noise = 0.1, .seed = 7}};
  return c;
}

etude::hyper tracking_hyper() {
  etude::hyper h;
  h.lr = 1e-2;
  h.warmup_steps = 20;
  h.total_steps = 200;
  h.weight_decay = 0.0;
  return h;
}

}  // namespace

TEST_CASE("the working copy is the master rounded to nearest even", "[precision]") {
  etude::cpu_trainer<etude::train_config<lm, pr::bf16>> t{tracking_hyper()};
  for (std::uint64_t s = 0; s < 3; ++s) t.step(corpus().sample(8, 32, s));
  const auto master = t.parameters();
  const auto working = t.working_parameters();
  REQUIRE(master.size() == working.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < master.size(); ++i) {
    const etude::bf16 expect(master[i]);
    if (!etude::same_bits(expect, working[i])) ++differ;
  }
  CHECK(differ == 0);
  // and the master really holds more than bf16 can: updates of lr-size do not vanish
  std::size_t finer = 0;
  for (std::size_t i = 0; i < master.size(); ++i) finer += static_cast<float>(working[i]) != master[i];
  CHECK(finer > master.size() / 2);
}

TEST_CASE("mixed policies start from the fp32 loss within the dtype's rounding", "[precision]") {
  const auto b = corpus().sample(8, 48, 1);
  etude::cpu_trainer<etude::train_config<lm, pr::fp32>> f32;
  etude::cpu_trainer<etude::train_config<lm, pr::bf16>> b16;
  etude::cpu_trainer<etude::train_config<lm, pr::fp16>> f16;
  const double ref = f32.evaluate(b).ce;
  const double eb = b16.evaluate(b).ce, eh = f16.evaluate(b).ce;
  std::printf("initial ce: fp32 %.6f bf16 %.6f (%.2e) fp16 %.6f (%.2e)\n", ref, eb, std::abs(eb - ref) / ref, eh,
              std::abs(eh - ref) / ref);
  CHECK(eb != ref);  // the policies do round
  // ~4L+3 stored tensors lie on the path to the logits, each rounded with relative error ≤ u;
  // independent roundings add in quadrature; 4× for correlation (as for the gradients below).
  // bf16 on dot-product instructions also rounds each layer's attention probabilities: 5L+3.
  const double n = 4.0 * shape.layers + 3;
  CHECK(std::abs(eb - ref) / ref < 4 * std::sqrt(n + shape.layers) * etude::dtype_traits<etude::bf16>::unit_roundoff);
  CHECK(std::abs(eh - ref) / ref < 4 * std::sqrt(n) * etude::dtype_traits<etude::fp16>::unit_roundoff);
}

namespace {

template <class T>
bool same_bytes(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

using fp16_trainer = etude::cpu_trainer<etude::train_config<lm, pr::fp16>>;

// Whether the gradients of `batch` overflow at the trainer's current scale, asked of a copy.
bool overflows(const fp16_trainer& t, const etude::batch_view& batch) {
  fp16_trainer probe = t;
  probe.loss_and_gradients(batch);
  const auto g = probe.gradients();
  return !etude::backend::cpu::all_finite(g.data(), static_cast<etude::index_t>(g.size()));
}

// Steps through `count` batches and checks each step against the overflow oracle: a step is
// skipped exactly when its gradients overflow, and a skipped step changes nothing but the scale.
int check_steps(fp16_trainer& t, std::uint64_t first, int count) {
  int skipped = 0;
  for (int i = 0; i < count; ++i) {
    const auto batch = corpus().sample(8, 32, first + static_cast<std::uint64_t>(i));
    const bool expect = overflows(t, batch);
    const std::vector<float> before(t.parameters().begin(), t.parameters().end());
    const std::vector<float> m_before(t.optimizer_state(0).begin(), t.optimizer_state(0).end());
    const long steps_before = t.steps_done();
    const double scale_before = t.loss_scale();
    const auto st = t.step(batch);
    INFO("step " << i << " at scale " << scale_before);
    REQUIRE(st.skipped == expect);
    CHECK(st.scale == scale_before);
    if (st.skipped) {
      ++skipped;
      CHECK(t.steps_done() == steps_before);
      CHECK(t.loss_scale() == scale_before * 0.5);
      CHECK(same_bytes<float>(t.parameters(), before));
      CHECK(same_bytes<float>(t.optimizer_state(0), m_before));
      CHECK(std::isfinite(st.ce));
    } else {
      CHECK(t.steps_done() == steps_before + 1);
      CHECK(!same_bytes<float>(t.optimizer_state(0), m_before));  // weights too, unless lr is 0 (warmup)
      CHECK(std::isfinite(st.grad_norm));
    }
  }
  return skipped;
}

}  // namespace

TEST_CASE("the fp16 loss scaler skips exactly the steps whose gradients overflow", "[precision]") {
  etude::hyper h = tracking_hyper();
  h.loss_scale = std::ldexp(1.0, 40);  // far beyond fp16's 65504: the first steps must overflow
  h.scale_interval = 1000;
  fp16_trainer t{h};
  const int skipped_at_start = check_steps(t, 100, 30);
  std::printf("fp16 scaler: %d of 30 steps skipped from scale 2^40, scale now 2^%d\n", skipped_at_start,
              static_cast<int>(std::log2(t.loss_scale())));
  CHECK(skipped_at_start >= 10);        // 2^40 → below 2^30 at least, given 65504 = 2^16
  CHECK(t.steps_done() == 30 - skipped_at_start);
  CHECK(t.skipped_steps() == skipped_at_start);
  // forced overflow in the middle of training: again skipped until the scale fits
  t.set_loss_scale(std::ldexp(1.0, 36), 0);
  const int skipped_mid = check_steps(t, 200, 20);
  CHECK(skipped_mid >= 6);
  CHECK(t.skipped_steps() == skipped_at_start + skipped_mid);
}

TEST_CASE("the fp16 loss scale grows after an interval of good steps", "[precision]") {
  etude::hyper h = tracking_hyper();
  h.loss_scale = 1024.0;
  h.scale_interval = 4;
  fp16_trainer t{h};
  std::vector<double> scales;
  for (std::uint64_t s = 0; s < 9; ++s) {
    const auto st = t.step(corpus().sample(8, 32, s));
    REQUIRE(!st.skipped);
    scales.push_back(st.scale);
  }
  CHECK(scales == std::vector<double>{1024, 1024, 1024, 1024, 2048, 2048, 2048, 2048, 4096});
  CHECK(t.good_steps() == 1);
}

TEST_CASE("a skipped step does not advance the learning-rate schedule", "[precision]") {
  etude::hyper h = tracking_hyper();
  h.warmup_steps = 10;
  h.loss_scale = std::ldexp(1.0, 40);
  fp16_trainer t{h};
  std::uint64_t s = 0;
  etude::step_stats st;
  do st = t.step(corpus().sample(8, 32, s++));
  while (st.skipped);
  CHECK(s > 1);
  CHECK(st.step == 1);
  CHECK(st.lr == 0.0);  // the first applied update is warmup's first, lr 0
  st = t.step(corpus().sample(8, 32, s++));
  CHECK(st.lr == Approx(h.lr / 10));
}

TEST_CASE("fp16 gradients are the scaled fp32 gradients within fp16 rounding", "[precision]") {
  const auto batch = corpus().sample(8, 32, 3);
  fp16_trainer f16{tracking_hyper()};
  const auto st = f16.loss_and_gradients(batch);
  etude::cpu_trainer<etude::train_config<lm, pr::fp32>> ref{tracking_hyper()};
  const auto st_ref = ref.loss_and_gradients(batch);
  std::vector<double> unscaled(f16.gradients().begin(), f16.gradients().end());
  for (double& g : unscaled) g /= st.scale;
  const double e = etude::test::relative_l2(std::span<const double>(unscaled), ref.gradients());
  // each gradient comes through ~4L+3 fp16 roundings (u = 2^-11 each) of the activations and
  // their gradients; errors of independent roundings add in quadrature: sqrt(11)·2^-11 ≈ 1.6e-3,
  // and we allow 4× that for the correlation along the residual stream
  const double bound = 4 * std::sqrt(4.0 * shape.layers + 3) * etude::dtype_traits<etude::fp16>::unit_roundoff;
  std::printf("fp16 gradients against fp32: relative L2 error %.3e (bound %.3e); grad norm %.6f vs %.6f\n", e, bound,
              st.grad_norm, st_ref.grad_norm);
  CHECK(e < bound);
  CHECK(st.grad_norm == Approx(st_ref.grad_norm).epsilon(bound));
}

TEST_CASE("per-role overrides train", "[precision]") {
  using grads16 = pr::bf16::with_grads<etude::bf16>;
  using acts16 = pr::fp32::with_activations<etude::bf16>;
  using states16 = pr::bf16::with_states<etude::bf16>;
  STATIC_REQUIRE(std::is_same_v<grads16::grad_t, etude::bf16>);
  STATIC_REQUIRE(std::is_same_v<grads16::master_t, float>);
  STATIC_REQUIRE(!acts16::has_master);
  STATIC_REQUIRE(std::is_same_v<acts16::activation_t, etude::bf16>);
  etude::cpu_trainer<etude::train_config<lm, grads16>> a{tracking_hyper()};
  etude::cpu_trainer<etude::train_config<lm, acts16>> b{tracking_hyper()};
  etude::cpu_trainer<etude::train_config<lm, states16>> c{tracking_hyper()};
  // the overrides reach the buffers: bf16 gradients, bf16 moments, bf16 activations in the arena
  STATIC_REQUIRE(std::is_same_v<decltype(a.gradients())::element_type, const etude::bf16>);
  STATIC_REQUIRE(std::is_same_v<decltype(c.optimizer_state(0))::element_type, etude::bf16>);
  // (statistics stay float, so a little over half)
  CHECK(etude::cpu_trainer<etude::train_config<lm, acts16>>::plan(8, 32).activations <
        0.55 * static_cast<double>(etude::cpu_trainer<etude::train_config<lm, pr::fp32>>::plan(8, 32).activations));
  double first_a = 0, first_b = 0, first_c = 0, last_a = 0, last_b = 0, last_c = 0;
  for (std::uint64_t s = 0; s < 30; ++s) {
    const auto batch = corpus().sample(8, 32, s);
    last_a = a.step(batch).ce;
    last_b = b.step(batch).ce;
    last_c = c.step(batch).ce;
    if (s == 0) first_a = last_a, first_b = last_b, first_c = last_c;
  }
  CHECK(last_a < first_a - 1.0);
  CHECK(last_b < first_b - 1.0);
  CHECK(last_c < first_c - 1.0);
  CHECK(pr::name_of<grads16>().find("grads bf16") != std::string::npos);
}
