// The trainer's contract, written once and run on every backend (Kokkos's category files): a
// translation unit defines ETUDE_CONTRACT_BACKEND (the backend type) and ETUDE_CONTRACT_TAG (a
// Catch2 tag, "[cpu]" or "[gpu]"), makes etude::trainer<Config, ETUDE_CONTRACT_BACKEND> usable for
// the configurations below (tests/contracts/configs.hpp; on CUDA through extern templates), and
// includes this file. Each contract holds on any backend: state that must not change is compared
// bit for bit; formulas are checked against their definition within float rounding (and, where the
// backend defines ETUDE_CONTRACT_FP64, once more on an fp64 trainer within 1e-12).
// tests/train/trainer_contracts.cpp runs them on the CPU, tests/gpu/trainer_contracts.cpp on a GPU and,
// compiled as it is, under the CUDA simulator (tests/cuda_sim, test_sim_contracts).
#pragma once

#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <etude/core/rng.hpp>
#include <etude/io/checkpoint.hpp>
#include <etude/train/adapters.hpp>

#include "../support.hpp"
#include "configs.hpp"

#ifndef ETUDE_CONTRACT_BACKEND
#error "define ETUDE_CONTRACT_BACKEND (and ETUDE_CONTRACT_TAG) before including tests/contracts/trainer.hpp"
#endif

namespace contract {

using backend = ETUDE_CONTRACT_BACKEND;
template <class Config>
using trainer_for = etude::trainer<Config, backend>;
using etude::index_t;

inline etude::token_batch random_batch(index_t batch, index_t frames, std::uint64_t seed) {
  etude::token_batch b(batch, contract_shape.codebooks, frames);
  etude::rng r(seed);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(contract_shape.card));
  return b;
}

template <class T>
std::vector<float> widen(std::span<const T> v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i]);
  return out;
}
// Through const access: reading the state must not mark it as written by the host.
template <class Trainer>
std::vector<float> params_of(const Trainer& t) { return widen(t.parameters()); }
template <class Trainer>
std::vector<float> grads_of(const Trainer& t) { return widen(t.gradients()); }
template <class Trainer>
std::vector<float> state_of(const Trainer& t, int i) { return widen(t.optimizer_state(i)); }
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Everything a step may change, copied for bitwise comparison.
struct snapshot {
  std::vector<float> params, grads;
  std::vector<std::vector<float>> states;
  long steps;
  template <class Trainer>
  explicit snapshot(const Trainer& t)
      : params(widen(t.parameters())), grads(widen(t.gradients())), steps(t.steps_done()) {
    for (int i = 0; i < Trainer::optimizer_state_count; ++i) states.push_back(widen(t.optimizer_state(i)));
  }
  bool operator==(const snapshot& o) const {
    if (!same_bits(params, o.params) || !same_bits(grads, o.grads) || steps != o.steps) return false;
    for (std::size_t i = 0; i < states.size(); ++i)
      if (!same_bits(states[i], o.states[i])) return false;
    return true;
  }
};

inline etude::hyper contract_hyper() {
  etude::hyper h;
  h.lr = 1e-2;
  h.warmup_steps = 0;
  h.total_steps = 100;
  h.clip_norm = 0.0;
  return h;
}

// The state in double, exactly: the update formulas are evaluated in double on what the trainer
// holds, whatever its precision (an fp64 trainer's values are not rounded to float on the way).
template <class T>
std::vector<double> exact(std::span<const T> v) {
  return std::vector<double>(v.begin(), v.end());
}
template <class Trainer>
std::vector<double> exact_params(const Trainer& t) { return exact(t.parameters()); }
template <class Trainer>
std::vector<double> exact_grads(const Trainer& t) { return exact(t.gradients()); }
template <class Trainer>
std::vector<double> exact_state(const Trainer& t, int i) { return exact(t.optimizer_state(i)); }

template <class Config>
inline constexpr bool is_fp64 = std::is_same_v<typename Config::precision, etude::precision::fp64>;

// |got − want| within float rounding of the update's size; in fp64 (the CPU's fp64 trainer: the
// update formulas' oracle) within 1e-12 relative or 1e-15 absolute.
template <class Config>
void check_update(const std::vector<double>& got, const std::vector<double>& want, double scale, const char* what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    const bool ok = is_fp64<Config> ? err <= std::max(1e-12 * std::fabs(want[i]), 1e-15)
                                    : err <= 1e-6 * std::fabs(want[i]) + 1e-5 * scale;
    if (!ok && bad++ == 0) first = i;
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements off, first at " << first);
  CHECK(bad == 0);
}

}  // namespace contract

TEST_CASE("contract: with warmup the first update has lr 0 and changes no parameter", "[contract]" ETUDE_CONTRACT_TAG) {
  auto h = contract::contract_hyper();
  h.warmup_steps = 5;
  contract::trainer_for<contract_adamw> t{h};
  const auto before = contract::params_of(t);
  const etude::step_stats st = t.step(contract::random_batch(4, 12, 1));
  CHECK(st.lr == 0.0);
  CHECK(t.steps_done() == 1);
  CHECK(contract::same_bits(contract::params_of(t), before));  // decay 1 − 0·wd, step 0
  const auto m = contract::state_of(t, 0);
  CHECK(std::any_of(m.begin(), m.end(), [](float x) { return x != 0.0f; }));  // the moments did move
  CHECK(t.step(contract::random_batch(4, 12, 2)).lr == Approx(h.lr / 5));
}

namespace contract {

template <class Adamw>
void adamw_first_update() {
  const auto h = contract_hyper();
  const auto batch = random_batch(4, 12, 3);
  trainer_for<Adamw> probe{h}, t{h};
  probe.loss_and_gradients(batch);
  const auto g = exact_grads(probe);
  const auto p0 = exact_params(t);
  const etude::step_stats st = t.step(batch);
  CHECK(st.lr == h.lr);  // cosine at update 0
  // t = 1: m = (1−β1) g, v = (1−β2) g², so p ← p(1 − lr·wd) − lr · g / (|g| + eps)
  std::vector<double> want(p0.size());
  for (std::size_t i = 0; i < p0.size(); ++i)
    want[i] = p0[i] * (1.0 - h.lr * h.weight_decay) - h.lr * g[i] / (std::fabs(g[i]) + h.eps);
  check_update<Adamw>(exact_params(t), want, h.lr, "adamw");
}

template <class Sgd>
void clipping() {
  auto h = contract_hyper();
  const auto batch = random_batch(4, 12, 4);
  h.clip_norm = 0.0;
  trainer_for<Sgd> probe{h};
  const double norm = probe.loss_and_gradients(batch).grad_norm;
  const auto g = exact_grads(probe);
  const auto p0 = exact_params(probe);
  h.clip_norm = 1e-3;
  trainer_for<Sgd> clipped{h};
  const etude::step_stats c = clipped.step(batch);
  REQUIRE(c.grad_norm > 1e-3);
  CHECK(c.grad_norm == Approx(norm).epsilon(is_fp64<Sgd> ? 1e-12 : 1e-5));
  CHECK(c.clip_coef == Approx(1e-3 / (c.grad_norm + 1e-6)).epsilon(1e-12));
  h.clip_norm = 1e6;
  trainer_for<Sgd> unclipped{h};
  CHECK(unclipped.step(batch).clip_coef == 1.0);
  // each step moved the weights by exactly its gradient, clipped or not (SGD, first update)
  auto check_first_update = [&](const trainer_for<Sgd>& t, double coef, const char* what) {
    std::vector<double> want(p0.size());
    for (std::size_t i = 0; i < p0.size(); ++i) {
      const double gi = g[i] * coef + h.weight_decay * p0[i];
      want[i] = p0[i] - h.lr * (gi + h.momentum * gi);  // Nesterov, buffer = g on the first update
    }
    check_update<Sgd>(exact_params(t), want, h.lr, what);
  };
  check_first_update(clipped, c.clip_coef, "clipped sgd");
  check_first_update(unclipped, 1.0, "unclipped sgd");
}

template <class Sgd>
void sgd_recurrence() {
  const auto h = contract_hyper();
  const auto b1 = random_batch(4, 12, 5), b2 = random_batch(4, 12, 6);
  trainer_for<Sgd> t{h}, probe{h};
  t.step(b1);
  const auto buf1 = exact_state(t, 0);
  const auto p1 = exact_params(t);
  probe.restore(1, std::as_const(t).parameters(), std::as_const(t).optimizer_state(0));
  probe.loss_and_gradients(b2);
  const auto g = exact_grads(probe);
  t.step(b2);
  std::vector<double> want_buf(p1.size()), want_p(p1.size());
  for (std::size_t i = 0; i < p1.size(); ++i) {
    const double gi = g[i] + h.weight_decay * p1[i];
    want_buf[i] = h.momentum * buf1[i] + gi;
    want_p[i] = p1[i] - h.lr * (gi + h.momentum * want_buf[i]);
  }
  check_update<Sgd>(exact_state(t, 0), want_buf, 1.0, "sgd buffer");
  check_update<Sgd>(exact_params(t), want_p, h.lr, "sgd parameters");
}

}  // namespace contract

// The update formulas, in the backend's float configurations and, where the backend has an fp64
// trainer (ETUDE_CONTRACT_FP64: the CPU), in fp64 to 1e-12: the one copy of the trainer's fp64
// formula checks.
TEST_CASE("contract: AdamW's first update is PyTorch's formula, with decay on every parameter", "[contract]" ETUDE_CONTRACT_TAG) {
  contract::adamw_first_update<contract_adamw>();
#ifdef ETUDE_CONTRACT_FP64
  contract::adamw_first_update<contract_adamw_fp64>();
#endif
}

TEST_CASE("contract: clipping scales by max_norm / (norm + 1e-6) only below 1", "[contract]" ETUDE_CONTRACT_TAG) {
  contract::clipping<contract_sgd>();
#ifdef ETUDE_CONTRACT_FP64
  contract::clipping<contract_sgd_fp64>();
#endif
}

TEST_CASE("contract: SGD with Nesterov momentum follows PyTorch's recurrence", "[contract]" ETUDE_CONTRACT_TAG) {
  contract::sgd_recurrence<contract_sgd>();
#ifdef ETUDE_CONTRACT_FP64
  contract::sgd_recurrence<contract_sgd_fp64>();
#endif
}

TEST_CASE("contract: evaluation changes no state, and evaluating between steps changes no trajectory", "[contract]" ETUDE_CONTRACT_TAG) {
  const auto h = contract::contract_hyper();
  contract::trainer_for<contract_adamw> with_eval{h}, without{h};
  with_eval.step(contract::random_batch(4, 12, 7));
  without.step(contract::random_batch(4, 12, 7));
  const contract::snapshot before(with_eval);
  const etude::eval_stats e = with_eval.evaluate(contract::random_batch(6, 20, 8));  // another shape
  CHECK(std::isfinite(e.ce));
  CHECK(contract::snapshot(with_eval) == before);
  with_eval.step(contract::random_batch(4, 12, 9));
  without.step(contract::random_batch(4, 12, 9));
  CHECK(contract::snapshot(with_eval) == contract::snapshot(without));
}

TEST_CASE("contract: hyperparameters out of their domain are refused by name", "[contract]" ETUDE_CONTRACT_TAG) {
  auto h = contract::contract_hyper();
  h.beta2 = 1.0;
  CHECK_THROWS_WITH(contract::trainer_for<contract_adamw>{h}, Catch::Contains("beta2 must be in [0, 1)"));
  h = contract::contract_hyper();
  h.total_steps = 0;
  CHECK_THROWS_AS(contract::trainer_for<contract_adamw>{h}, etude::invalid_argument);
}

TEST_CASE("contract: a skipped fp16 step changes nothing and does not advance the schedule", "[contract]" ETUDE_CONTRACT_TAG) {
  auto h = contract::contract_hyper();
  h.warmup_steps = 4;
  contract::trainer_for<contract_fp16> t{h};
  t.set_loss_scale(std::ldexp(1.0, 100));  // every fp16 gradient overflows
  const contract::snapshot before(t);
  const etude::step_stats s = t.step(contract::random_batch(4, 12, 10));
  CHECK(s.skipped);
  CHECK(t.skipped_steps() == 1);
  CHECK(t.loss_scale() == std::ldexp(1.0, 99));
  CHECK(contract::snapshot(t) == before);
  t.set_loss_scale(1024.0, 0, t.skipped_steps());
  const etude::step_stats a = t.step(contract::random_batch(4, 12, 11));
  CHECK_FALSE(a.skipped);
  CHECK(a.lr == 0.0);  // still the schedule's first update
  CHECK(t.steps_done() == 1);
}

TEST_CASE("contract: bad input is refused and leaves the state bit-identical", "[contract]" ETUDE_CONTRACT_TAG) {
  contract::trainer_for<contract_adamw> t{contract::contract_hyper()};
  t.step(contract::random_batch(4, 12, 12));
  const contract::snapshot before(t);
  auto bad = contract::random_batch(4, 12, 13);
  bad.at(2, 1, 5) = static_cast<etude::token_t>(contract_shape.card);
  CHECK_THROWS_WITH(t.step(bad), Catch::Contains("example 2") && Catch::Contains("codebook 1"));
  CHECK_THROWS_AS(t.step(contract::random_batch(3, 12, 14)), etude::invalid_input);  // not a multiple of 2
  CHECK_THROWS_AS(t.evaluate(bad), etude::invalid_input);
  CHECK(contract::snapshot(t) == before);
}

TEST_CASE("contract: save, restore and continue is bit-identical to training on", "[contract]" ETUDE_CONTRACT_TAG) {
  namespace fs = std::filesystem;
  const auto h = contract::contract_hyper();
  const fs::path dir = fs::temp_directory_path() / ("etude-contract-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  contract::trainer_for<contract_adamw> straight{h};
  for (std::uint64_t s = 0; s < 2; ++s) straight.step(contract::random_batch(4, 12, 20 + s));
  {
    etude::io::checkpoint_manager m(dir, {}, [](const std::string&) {});
    m.save(straight, {});
  }
  contract::trainer_for<contract_adamw> resumed{h};
  etude::io::checkpoint_manager m(dir, {}, [](const std::string&) {});
  const auto latest = m.latest();
  REQUIRE(latest);
  etude::io::restore(resumed, *latest);
  CHECK(contract::snapshot(resumed) == contract::snapshot(straight));
  for (std::uint64_t s = 2; s < 4; ++s)
    CHECK(resumed.step(contract::random_batch(4, 12, 20 + s)).ce == straight.step(contract::random_batch(4, 12, 20 + s)).ce);
  CHECK(contract::snapshot(resumed) == contract::snapshot(straight));
  fs::remove_all(dir);
}

// Weights only (io::save_weights, io::load_weights): a run that has state of its own takes another
// run's weights and nothing else. Its steps, optimiser state and gradients stay its own, the weights
// are the saved ones bit for bit, and the passes read them (on a device: uploaded before the next
// pass; under a mixed policy: the working copy refreshed), so it evaluates exactly as the run that
// saved them and then steps exactly as a trainer restored to the same state.
TEST_CASE("contract: a weights-only load replaces the weights and nothing else, and the next pass reads them", "[contract][weights]" ETUDE_CONTRACT_TAG) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("etude-contract-weights-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto h = contract::contract_hyper();
  auto other = h;  // another run: its own hyperparameters and initialisation
  other.lr = 3e-3;
  other.seed = h.seed + 1;
  const auto eval_batch = contract::random_batch(4, 12, 42);

  contract::trainer_for<contract_adamw> source{h};
  source.step(contract::random_batch(4, 12, 40));
  etude::io::save_weights(source, dir / "w.safetensors");
  contract::trainer_for<contract_adamw> fine{other};
  fine.step(contract::random_batch(4, 12, 43));  // state of its own, which the load must keep
  const contract::snapshot before(fine);
  REQUIRE_FALSE(contract::same_bits(before.params, contract::params_of(source)));
  const auto report = etude::io::load_weights(fine, dir / "w.safetensors");
  CHECK(report.loaded.size() == contract::trainer_for<contract_adamw>::params::count);
  CHECK(report.kept.empty());
  CHECK(report.skipped.empty());
  contract::snapshot loaded(fine);
  CHECK(contract::same_bits(loaded.params, contract::params_of(source)));
  loaded.params = before.params;  // all else as it was
  CHECK(loaded == before);
  CHECK(fine.evaluate(eval_batch).ce == source.evaluate(eval_batch).ce);
  contract::trainer_for<contract_adamw> reference{other};
  reference.restore(fine.steps_done(), std::as_const(source).parameters(), std::as_const(fine).optimizer_state(0),
                    std::as_const(fine).optimizer_state(1));
  const auto next = contract::random_batch(4, 12, 44);
  CHECK(fine.step(next).ce == reference.step(next).ce);
  CHECK(contract::snapshot(fine) == contract::snapshot(reference));

  // fp16 with an fp32 master: the loaded master's working copy is the saved run's
  contract::trainer_for<contract_fp16> source16{h};
  source16.step(contract::random_batch(4, 12, 45));
  etude::io::save_weights(source16, dir / "w16.safetensors");
  contract::trainer_for<contract_fp16> fine16{other};
  REQUIRE_FALSE(contract::same_bits(contract::params_of(fine16), contract::params_of(source16)));
  (void)etude::io::load_weights(fine16, dir / "w16.safetensors");
  CHECK(contract::same_bits(contract::params_of(fine16), contract::params_of(source16)));
  CHECK(contract::same_bits(contract::widen(fine16.working_parameters()), contract::widen(source16.working_parameters())));
  CHECK(fine16.evaluate(eval_batch).ce == source16.evaluate(eval_batch).ce);
  fs::remove_all(dir);
}

namespace contract {

// The message of the non_finite error f throws (fails the test when it throws nothing or another).
template <class F>
std::string non_finite_message(F&& f) {
  try {
    f();
  } catch (const etude::non_finite& e) {
    return e.what();
  }
  FAIL("no etude::non_finite thrown");
  return {};
}

// Everything a step may change, the loss scaler's state included.
struct full_snapshot {
  snapshot state;
  double scale;
  long good, skipped;
  template <class Trainer>
  explicit full_snapshot(const Trainer& t)
      : state(t), scale(t.loss_scale()), good(t.good_steps()), skipped(t.skipped_steps()) {}
  bool operator==(const full_snapshot& o) const {
    return state == o.state && scale == o.scale && good == o.good && skipped == o.skipped;
  }
};

// Puts `to` in `from`'s state through restore (a device trainer is not copyable).
template <class Trainer>
void restore_from(Trainer& to, const Trainer& from) {
  if constexpr (Trainer::optimizer_state_count > 1)
    to.restore(from.steps_done(), from.parameters(), from.optimizer_state(0), from.optimizer_state(1));
  else
    to.restore(from.steps_done(), from.parameters(), from.optimizer_state(0));
  to.set_loss_scale(from.loss_scale(), from.good_steps(), from.skipped_steps());
}

// `trained` one step along on batch b1, then a trainer with hyper `wild` put in that state: its
// step on b2 must be refused with a message naming `names`, change nothing, and a trainer with the
// sane hyperparameters restored from the refused one must then take exactly trained's next step.
template <class Config>
void check_refused(const etude::hyper& sane, const etude::hyper& wild, const std::vector<std::string>& names) {
  const auto b1 = random_batch(4, 12, 30), b2 = random_batch(4, 12, 31);
  trainer_for<Config> trained{sane};
  trained.step(b1);
  trainer_for<Config> refused{wild};
  restore_from(refused, std::as_const(trained));
  const full_snapshot before(refused);
  REQUIRE(before == full_snapshot(trained));
  const std::string message = non_finite_message([&] { refused.step(b2); });
  INFO(message);
  CHECK_THAT(message, Catch::Contains("step 1:") && Catch::Contains("nothing was changed") &&
                          Catch::Contains("Lower the learning rate"));
  for (const auto& n : names) CHECK_THAT(message, Catch::Contains(n));
  CHECK(full_snapshot(refused) == before);
  // refused again: the state is still the one before, so the same error
  CHECK(non_finite_message([&] { refused.step(b2); }) == message);
  CHECK(full_snapshot(refused) == before);
  trainer_for<Config> resumed{sane};
  restore_from(resumed, std::as_const(refused));
  const etude::step_stats a = resumed.step(b2), b = trained.step(b2);
  CHECK(std::isfinite(a.ce));
  CHECK(a.ce == b.ce);
  CHECK(resumed.steps_done() == 2);
  CHECK(full_snapshot(resumed) == full_snapshot(trained));
}

}  // namespace contract

TEST_CASE("contract: an AdamW update that would overflow (lr 1e38) is refused before it writes, naming the tensor", "[contract][non_finite]" ETUDE_CONTRACT_TAG) {
  auto wild = contract::contract_hyper();
  wild.lr = 1e38;
  contract::check_refused<contract_adamw>(contract::contract_hyper(), wild,
                                          {"adamw update at learning rate", "the weight of emb.0.weight (element 0 of"});
}

TEST_CASE("contract: an SGD update that would overflow is refused before it writes, naming the tensor", "[contract][non_finite]" ETUDE_CONTRACT_TAG) {
  auto wild = contract::contract_hyper();
  wild.lr = 1e39;  // infinite in float
  contract::check_refused<contract_sgd>(contract::contract_hyper(), wild,
                                        {"sgd_nesterov update", "the weight of emb.0.weight (element 0 of"});
}

TEST_CASE("contract: fp16: an update that overflows only the fp16 working copy is refused; overflowing gradients still skip", "[contract][non_finite]" ETUDE_CONTRACT_TAG) {
  auto wild = contract::contract_hyper();
  wild.lr = 1e5;  // AdamW moves each weight by about lr: past fp16's 65504, well within the fp32 master's range
  contract::check_refused<contract_fp16>(contract::contract_hyper(), wild, {"the f16 working copy of "});
  // gradients that overflow at the current scale are still a skip that lowers the scale, not an error
  contract::trainer_for<contract_fp16> t{wild};
  t.set_loss_scale(std::ldexp(1.0, 100));
  const contract::snapshot before(t);
  const etude::step_stats s = t.step(contract::random_batch(4, 12, 32));
  CHECK(s.skipped);
  CHECK(t.loss_scale() == std::ldexp(1.0, 99));
  CHECK(contract::snapshot(t) == before);
}

TEST_CASE("contract: finite gradients that overflow only the output heads' second moment are refused", "[contract][non_finite]" ETUDE_CONTRACT_TAG) {
  using params = contract::trainer_for<contract_adamw>::params;
  const auto h = contract::contract_hyper();
  contract::trainer_for<contract_adamw> t{h};
  const auto b1 = contract::random_batch(4, 12, 33), b2 = contract::random_batch(4, 12, 34);
  t.step(b1);
  // a huge final LayerNorm bias makes the heads' inputs ~1e24: their weight gradients (~1e22) are
  // finite in float but their squares are not, while every other gradient stays ordinary
  const etude::param_desc& bias = params::at(etude::param_kind::out_norm_bias);
  const std::vector<float> saved(t.tensor(bias).begin(), t.tensor(bias).end());
  for (auto& x : t.tensor_for_write(bias)) x = 1e24f;
  contract::trainer_for<contract_adamw> probe{h};
  contract::restore_from(probe, std::as_const(t));
  probe.loss_and_gradients(b2);
  const auto g = contract::grads_of(probe);
  REQUIRE(std::all_of(g.begin(), g.end(), [](float x) { return std::isfinite(x); }));
  const contract::full_snapshot before(t);
  const std::string message = contract::non_finite_message([&] { t.step(b2); });
  INFO(message);
  CHECK_THAT(message, Catch::Contains("exp_avg_sq of linears.0.weight") && Catch::Contains("nothing was changed"));
  CHECK(contract::full_snapshot(t) == before);
  std::copy(saved.begin(), saved.end(), t.tensor_for_write(bias).begin());
  CHECK(std::isfinite(t.step(b2).ce));
  CHECK(t.steps_done() == 2);
}

TEST_CASE("contract: evaluate refuses what step refuses: a fully padded batch, a non-finite loss", "[contract][eval]" ETUDE_CONTRACT_TAG) {
  contract::trainer_for<contract_adamw> t{contract::contract_hyper()};
  t.step(contract::random_batch(4, 12, 35));
  const contract::snapshot before(t);
  auto padded = contract::random_batch(4, 12, 36);
  std::fill(padded.mask.begin(), padded.mask.end(), static_cast<unsigned char>(0));
  CHECK_THROWS_WITH(t.step(padded), Catch::Contains("training batch: codebook 0 has no valid target token"));
  CHECK_THROWS_WITH(t.evaluate(padded), Catch::Contains("evaluation batch: codebook 0 has no valid target token"));
  CHECK_THROWS_AS(t.evaluate(padded), etude::invalid_input);
  // one codebook padded throughout: also refused by both
  auto one = contract::random_batch(4, 12, 37);
  for (etude::index_t e = 0; e < 4; ++e)
    for (etude::index_t f = 0; f < 12; ++f) one.mask_at(e, 2, f) = 0;
  CHECK_THROWS_WITH(t.step(one), Catch::Contains("codebook 2 has no valid target token"));
  CHECK_THROWS_WITH(t.evaluate(one), Catch::Contains("evaluation batch: codebook 2 has no valid target token"));
  CHECK(contract::snapshot(t) == before);
  // a non-finite weight: step and evaluate both throw non_finite
  contract::trainer_for<contract_adamw> bad{contract::contract_hyper()};
  contract::restore_from(bad, std::as_const(t));
  using params = contract::trainer_for<contract_adamw>::params;
  bad.tensor_for_write(params::at(etude::param_kind::head, -1, 1))[3] = std::numeric_limits<float>::quiet_NaN();
  const auto batch = contract::random_batch(4, 12, 38);
  CHECK_THROWS_AS(bad.step(batch), etude::non_finite);
  CHECK_THAT(contract::non_finite_message([&] { bad.evaluate(batch); }),
             Catch::Contains("loss of codebook 1 is not finite"));
}

// ---- the EMA of the weights (hyper.ema_decay) ------------------------------------------------------

namespace contract {
inline etude::hyper ema_hyper(double decay, long every) {
  etude::hyper h = contract_hyper();
  h.ema_decay = decay;
  h.ema_every = every;
  return h;
}
template <class Trainer>
std::vector<float> ema_of(const Trainer& t) { return widen(t.ema_parameters()); }

// `t`'s state saved into the emptied checkpoint directory `dir`, and the checkpoint read back.
template <class Trainer>
etude::io::checkpoint_file saved_checkpoint(const Trainer& t, const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  etude::io::checkpoint_manager m(dir, {}, [](const std::string&) {});
  m.save(t, {});
  auto latest = m.latest();
  REQUIRE(latest);
  return std::move(*latest);
}
}  // namespace contract

// AudioCraft's unbiased EMA (count <- count·decay + 1, w = 1/count) over the updates u with
// u % every == 0 is the closed form Σ decay^(n−j)·p_j / Σ decay^(n−j) over those updates' weights.
TEST_CASE("contract: the EMA of the weights is AudioCraft's unbiased average, every ema_every updates", "[contract][ema]" ETUDE_CONTRACT_TAG) {
  const double decay = 0.8;
  contract::trainer_for<contract_adamw> t{contract::ema_hyper(decay, 2)};
  REQUIRE(t.has_ema());
  CHECK(t.ema_count() == 0.0);
  CHECK(contract::same_bits(contract::ema_of(t), contract::params_of(t)));  // it starts as the weights
  auto last = contract::ema_of(t);
  std::vector<std::vector<double>> averaged;  // the weights after each EMA update
  for (std::uint64_t s = 0; s < 6; ++s) {
    t.step(contract::random_batch(4, 12, 60 + s));
    if ((s + 1) % 2 != 0) {
      CHECK(contract::same_bits(contract::ema_of(t), last));  // between two EMA updates nothing moves
      continue;
    }
    last = contract::ema_of(t);
    averaged.push_back(contract::exact_params(t));
    if (averaged.size() == 1) CHECK(contract::same_bits(contract::ema_of(t), contract::params_of(t)));  // a copy
  }
  const std::size_t n = averaged.size();
  double count = 0, den = 0;
  for (std::size_t j = 0; j < n; ++j) count = count * decay + 1;
  CHECK(t.ema_count() == count);
  std::vector<double> want(averaged[0].size(), 0.0);
  double scale = 0;
  for (std::size_t j = 0; j < n; ++j) {
    const double d = std::pow(decay, static_cast<double>(n - 1 - j));
    den += d;
    for (std::size_t i = 0; i < want.size(); ++i) want[i] += d * averaged[j][i];
  }
  for (auto& v : want) {
    v /= den;
    scale = std::max(scale, std::fabs(v));
  }
  contract::check_update<contract_adamw>(contract::exact(t.ema_parameters()), want, scale, "the EMA after 3 updates");
  // not the weights themselves: the average lags them
  CHECK_FALSE(contract::same_bits(contract::ema_of(t), contract::params_of(t)));
}

TEST_CASE("contract: a skipped fp16 step moves no EMA; ema_decay out of its domain is refused", "[contract][ema]" ETUDE_CONTRACT_TAG) {
  contract::trainer_for<contract_fp16> t{contract::ema_hyper(0.9, 1)};
  const auto before = contract::ema_of(t);
  t.set_loss_scale(std::ldexp(1.0, 100));  // every fp16 gradient overflows
  REQUIRE(t.step(contract::random_batch(4, 12, 70)).skipped);
  CHECK(contract::same_bits(contract::ema_of(t), before));
  CHECK(t.ema_count() == 0.0);
  t.set_loss_scale(1024.0, 0, t.skipped_steps());
  REQUIRE_FALSE(t.step(contract::random_batch(4, 12, 71)).skipped);
  CHECK(t.ema_count() == 1.0);
  CHECK(contract::same_bits(contract::ema_of(t), contract::params_of(t)));  // the first update copies the master

  CHECK_THROWS_WITH(contract::trainer_for<contract_adamw>{contract::ema_hyper(1.0, 1)},
                    Catch::Contains("ema_decay must be in [0, 1)"));
  CHECK_THROWS_WITH(contract::trainer_for<contract_adamw>{contract::ema_hyper(0.9, 0)},
                    Catch::Contains("ema_every must be >= 1"));
  contract::trainer_for<contract_adamw> none{contract::contract_hyper()};
  CHECK_FALSE(none.has_ema());
  CHECK(none.ema_parameters().empty());
  CHECK_THROWS_WITH(none.evaluate(contract::random_batch(4, 12, 72), etude::weight_set::ema),
                    Catch::Contains("needs an EMA of the weights"));
}

// Evaluating the EMA reads the average as the passes read weights (rounded to fp16 under the fp16
// policy) and leaves the trained weights' next pass untouched.
template <class Config>
void check_ema_evaluation() {
  const auto h = contract::ema_hyper(0.7, 1);
  contract::trainer_for<Config> t{h}, twin{h};
  for (std::uint64_t s = 0; s < 3; ++s) {
    t.step(contract::random_batch(4, 12, 80 + s));
    twin.step(contract::random_batch(4, 12, 80 + s));
  }
  const auto batch = contract::random_batch(6, 20, 84);
  const etude::eval_stats trained = t.evaluate(batch);
  const etude::eval_stats ema = t.evaluate(batch, etude::weight_set::ema);
  CHECK(ema.ce != trained.ce);
  // a trainer whose weights are the EMA evaluates the same, bit for bit
  contract::trainer_for<Config> holder{contract::contract_hyper()};
  const auto e = t.ema_parameters();
  auto w = holder.parameters_for_write();
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<typename contract::trainer_for<Config>::value_type>(e[i]);
  CHECK(holder.evaluate(batch).ce == ema.ce);
  // and nothing of it stays: the trained weights evaluate and step as the twin's, which never read the EMA
  CHECK(t.evaluate(batch).ce == trained.ce);
  const auto next = contract::random_batch(4, 12, 85);
  CHECK(t.step(next).ce == twin.step(next).ce);
  CHECK(contract::snapshot(t) == contract::snapshot(twin));
  CHECK(contract::same_bits(contract::ema_of(t), contract::ema_of(twin)));
}

TEST_CASE("contract: evaluating the EMA equals a trainer holding it as weights, and changes no trajectory", "[contract][ema]" ETUDE_CONTRACT_TAG) {
  SECTION("fp32") { check_ema_evaluation<contract_adamw>(); }
  SECTION("fp16 with an fp32 master") { check_ema_evaluation<contract_fp16>(); }
}

TEST_CASE("contract: the EMA is saved and restored with the run, and a resumed run averages on bit for bit", "[contract][ema]" ETUDE_CONTRACT_TAG) {
  namespace fs = std::filesystem;
  const auto h = contract::ema_hyper(0.9, 1);
  const fs::path dir = fs::temp_directory_path() / ("etude-contract-ema-" + std::to_string(::getpid()));
  contract::trainer_for<contract_adamw> straight{h};
  for (std::uint64_t s = 0; s < 2; ++s) straight.step(contract::random_batch(4, 12, 90 + s));
  const auto saved = contract::saved_checkpoint(straight, dir);
  contract::trainer_for<contract_adamw> resumed{h};
  etude::io::restore(resumed, saved);
  CHECK(resumed.ema_count() == straight.ema_count());
  CHECK(contract::same_bits(contract::ema_of(resumed), contract::ema_of(straight)));
  for (std::uint64_t s = 2; s < 4; ++s) {
    const auto b = contract::random_batch(4, 12, 90 + s);
    CHECK(resumed.step(b).ce == straight.step(b).ce);
  }
  CHECK(contract::snapshot(resumed) == contract::snapshot(straight));
  CHECK(contract::same_bits(contract::ema_of(resumed), contract::ema_of(straight)));
  CHECK(resumed.ema_count() == straight.ema_count());
  // a run without an EMA is another run: refused by name
  contract::trainer_for<contract_adamw> plain{contract::contract_hyper()};
  CHECK_THROWS_WITH(etude::io::restore(plain, saved), Catch::Contains("hyper.ema_decay"));
  // the EMA's weights as a weights file: what a generator or a fine-tune loads
  etude::io::save_weights(straight, dir / "ema.safetensors", etude::weight_set::ema);
  etude::io::load_weights(plain, dir / "ema.safetensors");
  CHECK(contract::same_bits(contract::params_of(plain), contract::ema_of(straight)));
  fs::remove_all(dir);
}

// ---- frozen groups (config/trainable.hpp) -----------------------------------------------------------

namespace contract {
// The tensors of a trainer's table that train, and those frozen.
template <class Trainer>
std::vector<const etude::param_desc*> tensors_where(bool trained) {
  std::vector<const etude::param_desc*> out;
  for (const auto& p : Trainer::params::entries)
    if (Trainer::trains(p) == trained) out.push_back(&p);
  return out;
}
template <class Trainer>
std::vector<float> tensor_of(const Trainer& t, const etude::param_desc& p) { return widen(t.tensor(p)); }

// A frozen configuration against the same model with everything trained, whose frozen tensors are
// put back to their initial values after each step: the trainable tensors' gradients and weights
// are the same bit for bit, the frozen ones never change, and no gradient or state exists for them.
template <class Frozen, class Full>
void check_frozen_against_full() {
  auto h = contract_hyper();  // clip_norm 0: the global norm would count the frozen gradients
  trainer_for<Frozen> f{h};
  trainer_for<Full> a{h};
  using F = trainer_for<Frozen>;
  const auto trained = tensors_where<F>(true), frozen = tensors_where<F>(false);
  REQUIRE_FALSE(frozen.empty());
  CHECK(F::PT < F::P);
  CHECK(f.gradients().size() == static_cast<std::size_t>(F::PT));
  CHECK(f.optimizer_state(0).size() == static_cast<std::size_t>(F::PT));
  // the same initialisation, tensor by tensor; under a mixed policy a frozen tensor's one copy is
  // its working copy, so it reads back rounded: the full model's frozen tensors start there too
  for (const auto* p : trained) REQUIRE(same_bits(tensor_of(f, *p), tensor_of(a, *p)));
  const auto initial = params_of(f);
  for (const auto* p : frozen) {
    auto w = a.tensor_for_write(*p);
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = static_cast<typename trainer_for<Full>::value_type>(initial[static_cast<std::size_t>(p->offset) + i]);
  }
  if constexpr (F::packed_master) {
    CHECK(F::plan(2, 12).master == F::PT * static_cast<etude::index_t>(sizeof(typename F::value_type)));
    CHECK(trainer_for<Full>::plan(2, 12).master - F::plan(2, 12).master ==
          (F::P - F::PT) * static_cast<etude::index_t>(sizeof(typename F::value_type)));
  }

  const auto b0 = random_batch(4, 12, 100);
  CHECK(f.loss_and_gradients(b0).ce == a.loss_and_gradients(b0).ce);
  for (const auto* p : trained) {
    INFO(etude::param_name(*p));
    CHECK(same_bits(widen(f.gradient(*p)), widen(a.gradient(*p))));
  }
  for (const auto* p : frozen) CHECK(f.gradient(*p).empty());

  for (std::uint64_t s = 0; s < 3; ++s) {
    const auto b = random_batch(4, 12, 101 + s);
    CHECK(f.step(b).ce == a.step(b).ce);
    for (const auto* p : frozen) {
      INFO(etude::param_name(*p));
      const auto want = std::vector<float>(initial.begin() + p->offset, initial.begin() + p->offset + p->numel());
      CHECK(same_bits(tensor_of(f, *p), want));
      auto w = a.tensor_for_write(*p);  // the full model's frozen tensors held where they were
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<typename trainer_for<Full>::value_type>(want[i]);
    }
    for (const auto* p : trained) {
      INFO(etude::param_name(*p) << " after step " << s + 1);
      CHECK(same_bits(tensor_of(f, *p), tensor_of(a, *p)));
    }
  }
}
}  // namespace contract

TEST_CASE("contract: frozen groups: the trainable tensors train as in the full model, the frozen never move", "[contract][frozen]" ETUDE_CONTRACT_TAG) {
  SECTION("embeddings and self-attention frozen, accumulate<2>") {
    contract::check_frozen_against_full<contract_frozen, contract_adamw>();
  }
  SECTION("fp16, only the FFNs trained") { contract::check_frozen_against_full<contract_fp16_ffn_only, contract_fp16>(); }
}

namespace contract {
// A frozen run (with an EMA of the weights) saved after 2 steps, restored into a fresh trainer and
// continued: the same weights, state and EMA bit for bit as the run that went on. With adapters'
// dropout the resumed run draws the same masks.
template <class Config>
void check_frozen_resume(const char* name, const std::string& trained = "transformer.layers.0.linear1.weight",
                         const std::string& frozen = "emb.0.weight", double lora_dropout = 0.0) {
  namespace fs = std::filesystem;
  auto h = ema_hyper(0.9, 1);
  h.lora_dropout = lora_dropout;
  const fs::path dir = fs::temp_directory_path() / ("etude-contract-frozen-" + std::string(name) + "-" + std::to_string(::getpid()));
  trainer_for<Config> straight{h};
  for (std::uint64_t s = 0; s < 2; ++s) straight.step(random_batch(4, 12, 110 + s));
  const auto saved = saved_checkpoint(straight, dir);
  using T = trainer_for<Config>;
  const std::string slot = T::config::optimizer::state_names[0];
  // with adapters the frozen base is not saved, only its digest
  constexpr bool adapted = T::params::adapter_count > 0;
  CHECK(saved.tensors().contains("model." + frozen) == !adapted);
  CHECK(saved.state().contains("base") == adapted);
  CHECK_FALSE(saved.tensors().contains("optim." + slot + "." + frozen));
  CHECK(saved.tensors().contains("optim." + slot + "." + trained));
  CHECK(saved.state()["config"].contains("trainable"));
  T resumed{h};
  etude::io::restore(resumed, saved);
  CHECK(snapshot(resumed) == snapshot(straight));
  CHECK(same_bits(ema_of(resumed), ema_of(straight)));
  for (std::uint64_t s = 2; s < 4; ++s) {
    const auto b = random_batch(4, 12, 110 + s);
    CHECK(resumed.step(b).ce == straight.step(b).ce);
  }
  CHECK(snapshot(resumed) == snapshot(straight));
  CHECK(same_bits(ema_of(resumed), ema_of(straight)));
  CHECK(same_bits(widen(resumed.working_parameters()), widen(straight.working_parameters())));
  fs::remove_all(dir);
}
}  // namespace contract

TEST_CASE("contract: a frozen run saves only what trains' optimiser state, and resumes bit for bit", "[contract][frozen]" ETUDE_CONTRACT_TAG) {
  SECTION("fp32, embeddings and self-attention frozen") { contract::check_frozen_resume<contract_frozen>("fp32"); }
  SECTION("fp16, only the FFNs trained (no master copy of the frozen)") {
    contract::check_frozen_resume<contract_fp16_ffn_only>("fp16");
  }
  // the same model with everything trained is another configuration
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("etude-contract-frozen-other-" + std::to_string(::getpid()));
  contract::trainer_for<contract_frozen> frozen{contract::contract_hyper()};
  frozen.step(contract::random_batch(4, 12, 120));
  const auto saved = contract::saved_checkpoint(frozen, dir);
  contract::trainer_for<contract_adamw> full{contract::contract_hyper()};
  CHECK_THROWS_WITH(etude::io::restore(full, saved), Catch::Contains("trainable"));
  fs::remove_all(dir);
}

TEST_CASE("contract: frozen groups: an update that would overflow names the first trainable tensor", "[contract][frozen][non_finite]" ETUDE_CONTRACT_TAG) {
  auto wild = contract::contract_hyper();
  wild.lr = 1e38;
  // the embeddings and layer 0's self-attention are frozen: the first trainable weight is norm2's
  contract::check_refused<contract_frozen>(contract::contract_hyper(), wild,
                                           {"the weight of transformer.layers.0.norm2.weight (element 0 of"});
}

// ---- low-rank adapters (config/adapt.hpp) ---------------------------------------------------------

namespace contract {
inline double relative_l2(const std::vector<double>& got, const std::vector<double>& want) {
  return etude::test::relative_l2(std::span(got), std::span(want));
}

// The adapted model against the model without adapters holding the merged weights W + s·B·A
// (etude::merged_weights): the same loss within float rounding, and every adapter's gradient the
// chain rule's through the merged weight's gradient dW (dB = s·dW·Aᵀ, dA = s·Bᵀ·dW) within 1e-5.
template <class Lora, class Full>
void check_lora_against_merged() {
  using L = trainer_for<Lora>;
  using params = typename L::params;
  const auto h = contract_hyper();
  L t{h};
  etude::test::randomise_adapters(t, 7, 0.05);
  trainer_for<Full> full{h};
  const auto merged = etude::merged_weights(t);
  auto w = full.parameters_for_write();
  REQUIRE(w.size() == merged.size());
  std::copy(merged.begin(), merged.end(), w.begin());
  const auto b = random_batch(4, 12, 100);
  const double adapted = t.loss_and_gradients(b).ce, plain = full.loss_and_gradients(b).ce;
  CHECK(adapted == Approx(plain).epsilon(1e-6));
  const double s = L::adapters::scale;
  constexpr etude::index_t r = L::adapters::rank;
  for (std::size_t i = 0; i < params::adapter_count; i += 2) {
    const etude::param_desc& a = params::entries[i];
    const etude::param_desc& bd = params::entries[i + 1];
    INFO(etude::param_name(bd));
    const auto place = etude::adapted_tensor<contract_shape>(a.target);
    const auto dw = exact(full.gradient(params::base::at(place.kind, a.layer, a.codebook)));
    const auto av = exact(t.tensor(a)), bv = exact(t.tensor(bd));
    const etude::index_t in = a.cols, out = bd.rows;
    std::vector<double> want_a(static_cast<std::size_t>(r * in)), want_b(static_cast<std::size_t>(out * r));
    for (etude::index_t o = 0; o < out; ++o)
      for (etude::index_t c = 0; c < in; ++c) {
        const double g = s * dw[static_cast<std::size_t>((place.first_row + o) * in + c)];
        for (etude::index_t k = 0; k < r; ++k) {
          want_b[static_cast<std::size_t>(o * r + k)] += g * av[static_cast<std::size_t>(k * in + c)];
          want_a[static_cast<std::size_t>(k * in + c)] += g * bv[static_cast<std::size_t>(o * r + k)];
        }
      }
    CHECK(relative_l2(exact(t.gradient(a)), want_a) < 1e-5);
    CHECK(relative_l2(exact(t.gradient(bd)), want_b) < 1e-5);
  }
}

// Only the adapters train: the gradients and optimiser state cover them alone, the base never
// moves (bit for bit, under a mixed policy its one copy the working copy), the adapters do, and
// the plan counts a master copy of the adapters only.
template <class Lora>
void check_lora_base_frozen() {
  using L = trainer_for<Lora>;
  using params = typename L::params;
  L t{contract_hyper()};
  etude::index_t adapter_elements = 0;
  for (std::size_t i = 0; i < params::adapter_count; ++i) adapter_elements += etude::detail::align16(params::entries[i].numel());
  CHECK(L::PT == adapter_elements);
  CHECK(t.gradients().size() == static_cast<std::size_t>(adapter_elements));
  CHECK(t.optimizer_state(0).size() == static_cast<std::size_t>(adapter_elements));
  if constexpr (L::packed_master)
    CHECK(L::plan(2, 12).master == adapter_elements * static_cast<etude::index_t>(sizeof(typename L::value_type)));
  const auto before = params_of(t);
  for (std::uint64_t s = 0; s < 3; ++s) t.step(random_batch(4, 12, 101 + s));
  const auto after = params_of(t);
  for (std::size_t i = 0; i < params::count; ++i) {
    const etude::param_desc& p = params::entries[i];
    INFO(etude::param_name(p));
    const auto first = before.begin() + p.offset, last = first + p.numel();
    const bool moved = !std::equal(first, last, after.begin() + p.offset,
                                   [](float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; });
    CHECK(moved == params::is_adapter(i));
  }
}
}  // namespace contract

TEST_CASE("contract: LoRA: the adapted model is the merged model, and its adapters' gradients follow from the merged weights'", "[contract][lora]" ETUDE_CONTRACT_TAG) {
  contract::check_lora_against_merged<contract_lora, contract_adamw>();
}

TEST_CASE("contract: LoRA: only the adapters have gradients and state, and only they move", "[contract][lora]" ETUDE_CONTRACT_TAG) {
  SECTION("fp32, every self-attention and FFN projection and the heads") { contract::check_lora_base_frozen<contract_lora>(); }
  SECTION("fp16, rsLoRA on q and v") { contract::check_lora_base_frozen<contract_fp16_lora>(); }
}

TEST_CASE("contract: LoRA: a run saves its adapters, their state and its base's digest, and resumes bit for bit", "[contract][lora]" ETUDE_CONTRACT_TAG) {
  SECTION("fp32") {
    contract::check_frozen_resume<contract_lora>("lora-fp32", "transformer.layers.0.linear1.lora_B.weight",
                                                 "transformer.layers.0.linear1.weight");
  }
  SECTION("fp16") {
    contract::check_frozen_resume<contract_fp16_lora>("lora-fp16", "transformer.layers.1.self_attn.v_proj.lora_A.weight",
                                                      "transformer.layers.1.self_attn.in_proj_weight");
  }
  SECTION("fp32 and fp16 with dropout on the adapters' input") {
    contract::check_frozen_resume<contract_lora>("lora-drop-fp32", "transformer.layers.0.linear1.lora_B.weight",
                                                 "transformer.layers.0.linear1.weight", 0.25);
    contract::check_frozen_resume<contract_fp16_lora>("lora-drop-fp16", "transformer.layers.1.self_attn.v_proj.lora_A.weight",
                                                      "transformer.layers.1.self_attn.in_proj_weight", 0.25);
  }
  // another adapter configuration is another run
  namespace fs = std::filesystem;
  using contract_lora_params = contract::trainer_for<contract_lora>::params;
  const fs::path dir = fs::temp_directory_path() / ("etude-contract-lora-other-" + std::to_string(::getpid()));
  contract::trainer_for<contract_lora> lora{contract::contract_hyper()};
  lora.step(contract::random_batch(4, 12, 120));
  const auto saved = contract::saved_checkpoint(lora, dir);
  contract::trainer_for<contract_frozen> frozen{contract::contract_hyper()};
  CHECK_THROWS_WITH(etude::io::restore(frozen, saved), Catch::Contains("adapters"));
  // the same configuration over other base weights (one value of one frozen tensor changed, as
  // another base file would) is refused, unchanged
  contract::trainer_for<contract_lora> other{contract::contract_hyper()};
  other.tensor_for_write(contract_lora_params::at(etude::param_kind::ffn_down, 1))[5] += 0.25f;
  const contract::snapshot before(other);
  CHECK_THROWS_WITH(etude::io::restore(other, saved), Catch::Contains("other base weights") && Catch::Contains("init_weights"));
  CHECK(contract::snapshot(other) == before);
  fs::remove_all(dir);
}
