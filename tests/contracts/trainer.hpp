// The trainer's contract, written once and run on every backend (Kokkos's category files): a
// translation unit defines ETUDE_CONTRACT_BACKEND (the backend type) and ETUDE_CONTRACT_TAG (a
// Catch2 tag, "[cpu]" or "[gpu]"), makes etude::trainer<Config, ETUDE_CONTRACT_BACKEND> usable for
// the configurations below (tests/contracts/configs.hpp; on CUDA through extern templates), and
// includes this file. Each contract holds on any backend: state that must not change is compared
// bit for bit; formulas are checked against their definition within float rounding.
// tests/unit/trainer_contracts.cpp runs them on the CPU, tests/gpu/trainer_contracts.cpp on a GPU.
#pragma once

#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <etude/core/rng.hpp>
#include <etude/io/checkpoint.hpp>

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

// |got − want| within float rounding of the update's size.
inline void check_update(const std::vector<float>& got, const std::vector<double>& want, double scale,
                         const char* what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= 1e-6 * std::fabs(want[i]) + 1e-5 * scale)) {
      if (bad++ == 0) first = i;
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

TEST_CASE("contract: AdamW's first update is PyTorch's formula, with decay on every parameter", "[contract]" ETUDE_CONTRACT_TAG) {
  const auto h = contract::contract_hyper();
  const auto batch = contract::random_batch(4, 12, 3);
  contract::trainer_for<contract_adamw> probe{h}, t{h};
  probe.loss_and_gradients(batch);
  const auto g = contract::grads_of(probe);
  const auto p0 = contract::params_of(t);
  const etude::step_stats st = t.step(batch);
  CHECK(st.lr == h.lr);  // cosine at update 0
  // t = 1: m = (1−β1) g, v = (1−β2) g², so p ← p(1 − lr·wd) − lr · g / (|g| + eps)
  std::vector<double> want(p0.size());
  for (std::size_t i = 0; i < p0.size(); ++i)
    want[i] = p0[i] * (1.0 - h.lr * h.weight_decay) - h.lr * g[i] / (std::fabs(g[i]) + h.eps);
  contract::check_update(contract::params_of(t), want, h.lr, "adamw");
}

TEST_CASE("contract: clipping scales by max_norm / (norm + 1e-6) only below 1", "[contract]" ETUDE_CONTRACT_TAG) {
  auto h = contract::contract_hyper();
  const auto batch = contract::random_batch(4, 12, 4);
  h.clip_norm = 1e-3;
  contract::trainer_for<contract_sgd> clipped{h};
  const etude::step_stats c = clipped.step(batch);
  REQUIRE(c.grad_norm > 1e-3);
  CHECK(c.clip_coef == Approx(1e-3 / (c.grad_norm + 1e-6)).epsilon(1e-12));
  h.clip_norm = 1e6;
  contract::trainer_for<contract_sgd> unclipped{h};
  CHECK(unclipped.step(batch).clip_coef == 1.0);
  // the clipped step moved the weights by exactly the clipped gradient (SGD, first update)
  h.clip_norm = 0.0;
  contract::trainer_for<contract_sgd> probe{h};
  probe.loss_and_gradients(batch);
  const auto g = contract::grads_of(probe);
  const auto p0 = contract::params_of(probe);
  std::vector<double> want(p0.size());
  for (std::size_t i = 0; i < p0.size(); ++i) {
    const double gi = g[i] * c.clip_coef + h.weight_decay * p0[i];
    want[i] = p0[i] - h.lr * (gi + h.momentum * gi);  // Nesterov, buffer = g on the first update
  }
  contract::check_update(contract::params_of(clipped), want, h.lr, "clipped sgd");
}

TEST_CASE("contract: SGD with Nesterov momentum follows PyTorch's recurrence", "[contract]" ETUDE_CONTRACT_TAG) {
  const auto h = contract::contract_hyper();
  const auto b1 = contract::random_batch(4, 12, 5), b2 = contract::random_batch(4, 12, 6);
  contract::trainer_for<contract_sgd> t{h}, probe{h};
  t.step(b1);
  const auto buf1 = contract::state_of(t, 0);
  const auto p1 = contract::params_of(t);
  probe.restore(1, std::as_const(t).parameters(), std::as_const(t).optimizer_state(0));
  probe.loss_and_gradients(b2);
  const auto g = contract::grads_of(probe);
  t.step(b2);
  std::vector<double> want_buf(p1.size()), want_p(p1.size());
  for (std::size_t i = 0; i < p1.size(); ++i) {
    const double gi = g[i] + h.weight_decay * p1[i];
    want_buf[i] = h.momentum * buf1[i] + gi;
    want_p[i] = p1[i] - h.lr * (gi + h.momentum * want_buf[i]);
  }
  contract::check_update(contract::state_of(t, 0), want_buf, 1.0, "sgd buffer");
  contract::check_update(contract::params_of(t), want_p, h.lr, "sgd parameters");
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
