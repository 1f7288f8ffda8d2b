// The training step's contract on the CPU: schedules, validation that changes nothing, determinism,
// initialisation, and bad input refused with a clear error and no state changed. The update formulas
// (optimisers, clipping) are the shared trainer contracts' (tests/contracts/trainer.hpp).
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <numbers>
#include <type_traits>
#include <utility>
#include <vector>

#include <etude/etude.hpp>

#include "../product_paths.hpp"

namespace pat = etude::pattern;
using etude::index_t;

namespace {

constexpr etude::shape small_shape{.codebooks = 4, .card = 16, .dim = 16, .heads = 2, .layers = 2, .max_len = 64};
using lm = etude::model<small_shape, pat::delay<0, 1, 2, 3>>;

etude::token_batch random_batch(index_t batch, index_t frames, std::uint64_t seed) {
  etude::token_batch b(batch, small_shape.codebooks, frames);
  etude::rng r(seed);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(small_shape.card));
  return b;
}

// Everything a step may change, copied for bitwise comparison.
template <class Trainer>
struct snapshot {
  std::vector<float> params, grads, m, v;
  long steps;
  explicit snapshot(Trainer& t)
      : params(t.parameters().begin(), t.parameters().end()),
        grads(t.gradients().begin(), t.gradients().end()),
        m(t.optimizer_state(0).begin(), t.optimizer_state(0).end()),
        v(t.optimizer_state(1).begin(), t.optimizer_state(1).end()),
        steps(t.steps_done()) {}
  bool operator==(const snapshot& o) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    return same(params, o.params) && same(grads, o.grads) && same(m, o.m) && same(v, o.v) && steps == o.steps;
  }
};

// The CPU op set counting AdamW checks handed a known range of the last update (which may then
// decide without reading the elements) and checks handed none.
struct range_counting_cpu : etude::backend::cpu {
  static inline int from_range = 0, without_range = 0;
  template <class M, class G, class S, class P = M>
  static void adamw_check(const M* p, const G* grad, const S* m, const S* v, index_t n,
                          const etude::optim::adamw::scalars* sc, etude::step_decision* d, const P* working = nullptr,
                          const etude::optim::update_range* last = nullptr) {
    ++(last != nullptr && last->known ? from_range : without_range);
    etude::backend::cpu::adamw_check(p, grad, m, v, n, sc, d, working, last);
  }
};

// The CPU op set counting the step's clears of the gradients that zero them and those their flag
// leaves out (clear_unless: the step's start and end; microbatches' own buffers are filled apart).
struct clear_counting_cpu : etude::backend::cpu {
  static inline int cleared = 0, left = 0;
  template <class T>
  static void clear_unless(T* x, index_t n, const int* keep) {
    ++(*keep == 0 ? cleared : left);
    etude::backend::cpu::clear_unless(x, n, keep);
  }
};

}  // namespace

TEST_CASE("schedules are evaluated before the update, with linear warmup", "[schedule]") {
  etude::hyper h;
  h.lr = 1.0;
  h.warmup_steps = 4;
  h.total_steps = 14;
  h.min_lr_ratio = 0.1;
  using namespace etude::schedule;
  CHECK(etude::learning_rate<cosine>(h, 0) == 0.0);
  CHECK(etude::learning_rate<cosine>(h, 2) == Approx(0.5));
  CHECK(etude::learning_rate<cosine>(h, 4) == Approx(1.0));
  CHECK(etude::learning_rate<cosine>(h, 9) == Approx(0.1 + 0.45 * (1 + std::cos(std::numbers::pi * 0.5))));
  CHECK(etude::learning_rate<cosine>(h, 14) == Approx(0.1));
  CHECK(etude::learning_rate<cosine>(h, 100) == Approx(0.1));
  CHECK(etude::learning_rate<linear>(h, 9) == Approx(1.0 - 0.9 * 0.5));
  CHECK(etude::learning_rate<constant>(h, 3) == Approx(0.75));
  CHECK(etude::learning_rate<constant>(h, 1000) == 1.0);
  CHECK(etude::learning_rate<inverse_sqrt>(h, 16) == Approx(0.5));
  h.warmup_steps = 0;
  CHECK(etude::learning_rate<inverse_sqrt>(h, 0) == 1.0);
  CHECK(etude::learning_rate<inverse_sqrt>(h, 4) == Approx(0.5));
}

TEST_CASE("with warmup the first update has lr 0 and changes no parameter", "[step]") {
  etude::hyper h;
  h.warmup_steps = 3;
  h.total_steps = 10;
  etude::cpu_trainer<etude::train_config<lm>> tr{h};
  const std::vector<float> before(tr.parameters().begin(), tr.parameters().end());
  const auto st = tr.step(random_batch(2, 8, 1));
  CHECK(st.lr == 0.0);
  CHECK(st.step == 1);
  CHECK(std::memcmp(before.data(), tr.parameters().data(), before.size() * sizeof(float)) == 0);
  // ...but the moments were updated, and the second update moves the weights
  double moments = 0;
  etude::backend::cpu::sum_squares(tr.optimizer_state(0).data(), index_t(tr.optimizer_state(0).size()), &moments);
  CHECK(moments > 0);
  const auto st2 = tr.step(random_batch(2, 8, 2));
  CHECK(st2.lr == Approx(h.lr / 3));
  CHECK(std::memcmp(before.data(), tr.parameters().data(), before.size() * sizeof(float)) != 0);
}

// AdamW's first update, global-norm clipping and SGD's Nesterov recurrence against their formulas in
// fp64 are the trainer contracts' (tests/contracts/trainer.hpp, on the CPU's fp64 trainer too:
// tests/train/trainer_contracts.cpp), written once for every backend.

TEST_CASE("validation touches no parameter, gradient or optimiser state", "[step][eval]") {
  etude::hyper h;
  h.lr = 1e-3;
  etude::cpu_trainer<etude::train_config<lm, etude::accumulate<2>>> tr{h};
  tr.step(random_batch(4, 8, 5));
  tr.step(random_batch(4, 8, 6));
  const snapshot before(tr);
  const auto ev = tr.evaluate(random_batch(3, 12, 7));
  CHECK(std::isfinite(ev.ce));
  CHECK(ev.ppl == Approx(std::exp(ev.ce)));
  CHECK(ev.tokens == 3 * (4 * 12 - 6));  // delay [0,1,2,3]: codebook k trains on T - k frames
  CHECK(snapshot(tr) == before);
}

TEST_CASE("an evaluation of a larger batch between steps leaves the training trajectory bit-identical", "[step][eval]") {
  etude::hyper h;
  h.lr = 3e-3;
  etude::cpu_trainer<etude::train_config<lm>> with_eval{h}, without{h};
  with_eval.step(random_batch(2, 8, 40));
  without.step(random_batch(2, 8, 40));
  with_eval.evaluate(random_batch(6, 20, 41));  // grows every workspace past the training size
  with_eval.step(random_batch(2, 8, 42));
  without.step(random_batch(2, 8, 42));
  CHECK(snapshot(with_eval) == snapshot(without));
}

TEST_CASE("evaluation equals the loss of the training objective on the same batch", "[step][eval]") {
  etude::cpu_trainer<etude::train_config<lm>> tr;
  const auto data = random_batch(2, 9, 8);
  const double ce = tr.evaluate(data).ce;
  CHECK(tr.loss_and_gradients(data).ce == Approx(ce).epsilon(1e-12));
}

TEST_CASE("same seed, same batches: bit-identical training", "[step][determinism]") {
  etude::hyper h;
  h.lr = 3e-3;
  h.warmup_steps = 1;
  h.total_steps = 10;
  etude::cpu_trainer<etude::train_config<lm, etude::accumulate<2>>> a{h}, b{h};
  for (int s = 0; s < 3; ++s) {
    const auto data = random_batch(4, 10, 30 + static_cast<std::uint64_t>(s));
    const auto sa = a.step(data), sb = b.step(data);
    CHECK(sa.ce == sb.ce);
    CHECK(sa.grad_norm == sb.grad_norm);
  }
  CHECK(snapshot(a) == snapshot(b));
  h.seed = 43;
  etude::cpu_trainer<etude::train_config<lm, etude::accumulate<2>>> c{h};
  CHECK(std::memcmp(c.parameters().data(), etude::cpu_trainer<etude::train_config<lm, etude::accumulate<2>>>{}.parameters().data(),
                    c.parameters().size() * sizeof(float)) != 0);
}

// A user's backend derived from the CPU's, overriding nothing: it finds the CPU's step executor
// through its base (ops/step_executor.hpp's step_executor_for), with no specialisation, and
// trains the same bits.
struct my_cpu : etude::backend::cpu {};
static_assert(std::is_same_v<etude::step_executor_of<my_cpu>, etude::cpu_step_executor>);
static_assert(etude::step_executor<etude::step_executor_of<my_cpu>>);
// The short names of the trainer on each backend (the CUDA one is only named here, never instantiated).
static_assert(std::is_same_v<etude::cpu_trainer<etude::train_config<lm>>, etude::trainer<etude::train_config<lm>, etude::backend::cpu>>);
static_assert(std::is_same_v<etude::cuda_trainer<etude::train_config<lm>>, etude::trainer<etude::train_config<lm>, etude::backend::cuda>>);

TEST_CASE("a backend derived from the CPU's trains bit-identically on the CPU's executor", "[step][determinism]") {
  etude::hyper h;
  h.lr = 3e-3;
  h.warmup_steps = 1;
  h.total_steps = 10;
  using cfg = etude::train_config<lm, etude::accumulate<2>>;
  etude::trainer<cfg, etude::backend::cpu> a{h};
  etude::trainer<cfg, my_cpu> b{h};
  STATIC_REQUIRE(std::is_same_v<decltype(b)::executor, etude::cpu_step_executor>);
  for (int s = 0; s < 3; ++s) {
    const auto data = random_batch(4, 10, 60 + static_cast<std::uint64_t>(s));
    const auto sa = a.step(data), sb = b.step(data);
    CHECK(std::memcmp(&sa.ce, &sb.ce, sizeof sa.ce) == 0);
    CHECK(std::memcmp(&sa.grad_norm, &sb.grad_norm, sizeof sa.grad_norm) == 0);
  }
  const snapshot x(a);
  const snapshot y(b);
  auto same_bits = [](const std::vector<float>& u, const std::vector<float>& w) {
    return u.size() == w.size() && std::memcmp(u.data(), w.data(), u.size() * sizeof(float)) == 0;
  };
  CHECK(same_bits(x.params, y.params));
  CHECK(same_bits(x.grads, y.grads));
  CHECK(same_bits(x.m, y.m));
  CHECK(same_bits(x.v, y.v));
  CHECK(x.steps == 3);
  CHECK(y.steps == 3);
}

// bf16 training's bits on every path bf16 products can take here (etude's kernels, oneDNN on the
// CPU's bf16 instructions or AMX tiles, widened sgemm), so no claim rests on the path a CPU picks:
// the same weights and moments after 3 steps on every run; the same as one thread on etude's kernels,
// whose products do not depend on the team (oneDNN promises one shape and thread count, no more);
// and two trainers stepped at once by the threads of a parallel region (every product then on its
// thread alone, the workspaces each trainer's own) each equal to one trainer on one thread.
TEST_CASE("bf16 training: the same bits on every run, on every bf16 path, nested or not", "[step][determinism]") {
  static constexpr etude::shape s{.codebooks = 4, .card = 64, .dim = 128, .heads = 2, .layers = 2, .max_len = 64};
  using cfg = etude::train_config<etude::model<s, pat::delay<0, 1, 2, 3>>, etude::precision::bf16,
                                  etude::accumulate<2>, etude::checkpointing::selective>;
  using trainer = etude::cpu_trainer<cfg>;
  etude::hyper h;
  h.lr = 3e-3;
  h.warmup_steps = 1;
  h.total_steps = 10;
  const auto batch = [](std::uint64_t seed) {
    etude::token_batch b(4, s.codebooks, 40);
    etude::rng r(seed);
    for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(s.card));
    return b;
  };
  const auto train = [&] {
    auto t = std::make_unique<trainer>(h);
    for (std::uint64_t step = 0; step < 3; ++step) t->step(batch(60 + step));
    return snapshot<trainer>(*t);
  };
  for (const auto path : etude::test::bf16_paths_here()) {
    etude::test::bf16_path_scope on(path);
    INFO("path " << etude::test::name(path) << ": " << etude::backend::cpu::bf16_products());
    const auto first = train();
    for (int run = 0; run < 2; ++run) CHECK(train() == first);
    const int team = omp_get_max_threads();
    omp_set_num_threads(1);
    const auto alone = train();
    omp_set_num_threads(team);
    if (path == etude::test::bf16_path::own) CHECK(alone == first);
    std::vector<snapshot<trainer>> nested;
    std::mutex m;
#pragma omp parallel num_threads(2)
    {
      auto mine = train();
      std::lock_guard lock(m);
      nested.push_back(std::move(mine));
    }
    REQUIRE(nested.size() == 2);
    CHECK(nested[0] == alone);
    CHECK(nested[1] == alone);
    CHECK_FALSE(alone.params == snapshot<trainer>(*std::make_unique<trainer>(h)).params);
  }
}

TEST_CASE("initialisation follows AudioCraft", "[init]") {
  constexpr etude::shape s{.codebooks = 2, .card = 512, .dim = 64, .heads = 4, .layers = 3, .max_len = 64};
  using big = etude::model<s, pat::parallel>;
  etude::cpu_trainer<etude::train_config<big>> tr;
  auto stats = [&](const etude::param_desc& p) {
    double sum = 0, sq = 0, peak = 0;
    for (float x : tr.tensor(p)) {
      sum += x;
      sq += double(x) * x;
      peak = std::max(peak, std::abs(double(x)));
    }
    const double n = double(p.numel());
    return std::array<double, 2>{std::sqrt(sq / n - (sum / n) * (sum / n)), peak};
  };
  using etude::param_kind;
  const double d = 64;
  const auto emb = stats(big::params::at(param_kind::embedding, -1, 0));
  // a normal truncated at ±3σ has std 0.9866σ
  CHECK(emb[0] == Approx(0.9866 / std::sqrt(d)).epsilon(0.03));
  CHECK(emb[1] <= 3 / std::sqrt(d));
  const auto head = stats(big::params::at(param_kind::head, -1, 1));
  CHECK(head[0] == Approx(0.9866 / std::sqrt(d)).epsilon(0.03));
  for (int l = 0; l < 3; ++l) {
    const auto up = stats(big::params::at(param_kind::ffn_up, l));
    CHECK(up[0] == Approx(0.9866 / std::sqrt(d) / std::sqrt(2.0 * (l + 1))).epsilon(0.03));
    const auto down = stats(big::params::at(param_kind::ffn_down, l));
    CHECK(down[0] == Approx(0.9866 / std::sqrt(4 * d) / std::sqrt(2.0 * (l + 1))).epsilon(0.03));
    const auto qkv = stats(big::params::at(param_kind::qkv, l));
    CHECK(qkv[0] == Approx(1 / std::sqrt(3 * d)).epsilon(0.03));  // U(±1/sqrt(d)) has std 1/sqrt(3d)
    CHECK(qkv[1] <= 1 / std::sqrt(d));
    for (float x : tr.tensor(big::params::at(param_kind::norm1_weight, l))) CHECK(x == 1.0f);
    for (float x : tr.tensor(big::params::at(param_kind::norm2_bias, l))) CHECK(x == 0.0f);
  }
}

TEST_CASE("bad input is refused with a clear error and no state changed", "[step][errors]") {
  etude::hyper h;
  h.lr = 1e-3;
  etude::cpu_trainer<etude::train_config<lm, etude::accumulate<2>>> tr{h};
  tr.step(random_batch(2, 8, 9));
  const snapshot before(tr);
  auto expect = [&](const etude::token_batch& b, const std::string& fragment) {
    try {
      tr.step(b);
      FAIL("no error for: " << fragment);
    } catch (const etude::invalid_input& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(fragment) != std::string::npos);
    }
    CHECK(snapshot(tr) == before);
  };
  auto b = random_batch(2, 8, 10);
  b.at(1, 2, 3) = small_shape.card;
  expect(b, "token 16 at example 1, codebook 2, frame 3 is outside [0, 16)");
  b.at(1, 2, 3) = -1;
  expect(b, "token -1 at example 1, codebook 2, frame 3");
  expect(random_batch(3, 8, 11), "cannot be split into accumulate<2> microbatches");
  expect(random_batch(2, 64, 12), "has 64 frames; with this pattern shape.max_len (64) allows at most 63");
  etude::token_batch wrong_k(2, 3, 8);
  expect(wrong_k, "has 3 codebooks but the model has 4");
  auto all_padding = random_batch(2, 8, 13);
  for (int t = 0; t < 8; ++t)
    for (int e = 0; e < 2; ++e) all_padding.mask_at(e, 1, t) = 0;
  expect(all_padding, "codebook 1 has no valid target token");
  CHECK_THROWS_AS(tr.evaluate(wrong_k), etude::invalid_input);
}

// A step leaves out its first clear of the gradients where the last pass cleared them at its end:
// after a step that updated (and kept nothing), not after loss_and_gradients or a step that stopped
// with the gradients kept for its report.
TEST_CASE("a step starts from clear gradients after whatever came before it", "[step]") {
  etude::hyper h;
  h.lr = 3e-3;
  h.warmup_steps = 0;
  using config = etude::train_config<lm, etude::accumulate<2>>;
  etude::cpu_trainer<config> plain{h}, probed{h}, failed{h};
  for (auto* t : {&plain, &probed, &failed}) t->step(random_batch(4, 8, 50));
  // loss_and_gradients leaves its gradients for the caller to read: the next step must not add to them
  const auto seen = probed.loss_and_gradients(random_batch(4, 8, 51));
  CHECK(seen.grad_norm > 0.0);
  CHECK(std::any_of(probed.gradients().begin(), probed.gradients().end(), [](float g) { return g != 0.0f; }));
  // a non-finite gradient stops the step with its gradients kept for the report (then cleared by
  // the trainer); the weight is put back before the next step
  auto w = failed.tensor_for_write(lm::params::at(etude::param_kind::ffn_up, 1));
  const float was = w[5];
  w[5] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(failed.step(random_batch(4, 8, 52)), etude::non_finite);
  failed.tensor_for_write(lm::params::at(etude::param_kind::ffn_up, 1))[5] = was;
  for (std::uint64_t s = 53; s < 56; ++s)
    for (auto* t : {&plain, &probed, &failed}) t->step(random_batch(4, 8, s));
  CHECK(snapshot(probed) == snapshot(plain));
  CHECK(snapshot(failed) == snapshot(plain));
  CHECK(std::all_of(plain.gradients().begin(), plain.gradients().end(), [](float g) { return g == 0.0f; }));
  // and the clear is really left out: (clears that zeroed, clears left out) over each pass
  using counted = clear_counting_cpu;
  etude::trainer<config, counted> tr{h};
  using counts = std::pair<int, int>;
  auto pass = [&](bool update, std::uint64_t seed) {
    counted::cleared = counted::left = 0;
    if (update) tr.step(random_batch(4, 8, seed));
    else tr.loss_and_gradients(random_batch(4, 8, seed));
    return counts{counted::cleared, counted::left};
  };
  CHECK(pass(true, 60) == counts{2, 0});   // the first step clears at its start and its end
  CHECK(pass(true, 61) == counts{1, 1});   // then only at its end
  CHECK(pass(false, 62) == counts{0, 1});  // loss_and_gradients leaves its gradients
  CHECK(pass(true, 63) == counts{2, 0});   // so the next step clears them first
  CHECK(pass(true, 64) == counts{1, 1});
}

TEST_CASE("a non-finite loss or gradient stops the step and changes nothing", "[step][errors]") {
  etude::hyper h;
  h.lr = 1e-3;
  etude::cpu_trainer<etude::train_config<lm>> tr{h};
  tr.step(random_batch(2, 8, 14));
  auto w = tr.tensor_for_write(lm::params::at(etude::param_kind::ffn_up, 1));
  w[5] = std::numeric_limits<float>::infinity();
  const snapshot before(tr);
  try {
    tr.step(random_batch(2, 8, 15));
    FAIL("no error");
  } catch (const etude::non_finite& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("step 1") != std::string::npos);
    CHECK(std::string(e.what()).find("No parameter or optimiser state was changed") != std::string::npos);
  }
  CHECK(snapshot(tr) == before);
}

TEST_CASE("the update's check reads the state again after the host wrote it", "[step][errors]") {
  // after an update the next check may decide from the range that update stored; a moment written
  // since (here a negative second moment, which would make a weight NaN) must be found by reading
  // the elements, whether written through optimizer_state() or restore()
  etude::hyper h;
  h.lr = 1e-3;
  etude::cpu_trainer<etude::train_config<lm>> tr{h};
  tr.step(random_batch(2, 8, 16));
  tr.step(random_batch(2, 8, 17));
  const snapshot good(tr);
  const index_t at = lm::params::at(etude::param_kind::ffn_up, 1).offset + 3;
  auto expect_refused = [&](const char* how) {
    INFO(how);
    const snapshot before(tr);
    try {
      tr.step(random_batch(2, 8, 18));
      FAIL("no error");
    } catch (const etude::non_finite& e) {
      INFO(e.what());
      CHECK_THAT(e.what(), Catch::Contains("the weight of transformer.layers.1.linear1.weight (element 3"));
    }
    CHECK(snapshot(tr) == before);
  };
  tr.optimizer_state(1)[static_cast<std::size_t>(at)] = -1.0f;
  expect_refused("through optimizer_state()");
  tr.optimizer_state(1)[static_cast<std::size_t>(at)] = good.v[static_cast<std::size_t>(at)];
  CHECK(snapshot(tr) == good);
  std::vector<float> v = good.v;
  v[static_cast<std::size_t>(at)] = -1.0f;
  tr.restore(tr.steps_done(), good.params, good.m, v);
  expect_refused("through restore()");
  tr.restore(tr.steps_done(), good.params, good.m, good.v);
  CHECK(std::isfinite(tr.step(random_batch(2, 8, 18)).ce));
}

TEST_CASE("the trainer hands the update's check the last update's range until the host writes", "[step]") {
  // the range is what lets the check skip its passes over the elements; a writable view of the
  // weights or states (whatever is written through it) must make the next check read them
  using counted = range_counting_cpu;
  etude::hyper h;
  h.lr = 1e-3;
  etude::trainer<etude::train_config<lm>, counted> tr{h};
  std::uint64_t seed = 20;
  // (checks handed a known range, checks handed none) over one step
  auto step = [&] {
    counted::from_range = counted::without_range = 0;
    tr.step(random_batch(2, 8, seed++));
    return std::pair{counted::from_range, counted::without_range};
  };
  using counts = std::pair<int, int>;
  CHECK(step() == counts{0, 1});  // no update has stored a range yet
  CHECK(step() == counts{1, 0});
  CHECK(step() == counts{1, 0});
  const auto& seen = tr;  // read-only views leave it
  CHECK(seen.parameters().size() == seen.optimizer_state(1).size());
  CHECK(step() == counts{1, 0});
  tr.optimizer_state(1);
  CHECK(step() == counts{0, 1});
  CHECK(step() == counts{1, 0});
  tr.parameters_for_write();
  CHECK(step() == counts{0, 1});
  tr.tensor_for_write(lm::params::at(etude::param_kind::ffn_up, 1));
  CHECK(step() == counts{0, 1});
  CHECK(step() == counts{1, 0});
  // reading through a non-const trainer is a read too
  CHECK(tr.parameters().size() == seen.parameters().size());
  CHECK(tr.tensor(lm::params::at(etude::param_kind::ffn_up, 1)).size() > 0);
  CHECK(step() == counts{1, 0});
}

TEST_CASE("hyperparameters out of their domain are named", "[errors]") {
  using trainer_t = etude::cpu_trainer<etude::train_config<lm>>;
  etude::hyper h;
  h.warmup_steps = 100;
  h.total_steps = 50;
  CHECK_THROWS_WITH(trainer_t{h}, Catch::Contains("total_steps (50) must exceed warmup_steps (100)"));
  h = {};
  h.beta2 = 1.0;
  CHECK_THROWS_WITH(trainer_t{h}, Catch::Contains("beta2 must be in [0, 1)"));
  h = {};
  h.lr = -1;
  CHECK_THROWS_AS(trainer_t{h}, etude::invalid_argument);
}

TEST_CASE("memory report: allocated against reserved, and their peaks", "[step][memory]") {
  etude::cpu_trainer<etude::train_config<lm>> tr;
  const auto small = tr.step(random_batch(2, 8, 50)).memory;
  const etude::index_t state = 3 * lm::params::total_elements * static_cast<etude::index_t>(sizeof(float));
  CHECK(small.allocated > state);  // parameters, gradients, two moments (- one buffer: AdamW has m and v)
  CHECK(small.reserved >= small.allocated);
  tr.evaluate(random_batch(6, 20, 51));  // grows the workspaces
  const auto grown = tr.memory();
  CHECK(grown.peak_allocated > small.allocated);
  CHECK(grown.reserved > small.reserved);
  const auto again = tr.step(random_batch(2, 8, 52)).memory;
  CHECK(again.allocated == small.allocated);  // the same batch uses the same bytes...
  CHECK(again.reserved > small.reserved);     // ...of workspaces that stay grown (the position table
  CHECK(again.reserved <= grown.reserved);    // keeps the longest length; allocated counts the rows read)
  CHECK(again.peak_allocated == grown.peak_allocated);
  CHECK(again.peak_reserved == grown.peak_reserved);
}
