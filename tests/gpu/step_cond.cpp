// A conditioned model's step on backend::cuda (the condition ops and cross-attention of
// condition.cuh and cross_attention.cuh) against the same trainer on backend::cpu, the oracle:
// same configuration (step_configs.hpp's cond_fp32_config: an attribute and a padded embedding
// fused by masked cross-attention), hyperparameters, batches and initial weights. The batches hold
// a null attribute, padded embedding positions and an example with no valid condition position at
// all (its cross-attention rows attend to nothing: att 0, lse +inf). Also: a prefetched batch is
// reused only when its conditions are the same, not just its tokens; and the cross-attention op
// itself against the CPU's on conditions longer than one 32-key chunk, masked, with rows that have
// no valid position, for both head dimensions, in fp32 and bf16. And the same conditions prepended
// (fuse::prepend, prepend_fp32_config) against the CPU trainer.
// Bounds as in step.cpp for fp32: 1e-5 on the loss, 1e-4 (relative L2) on every gradient tensor
// and on the weights after three steps. Compiled by g++; the device trainer is behind
// step_device.hpp (step_device_cond.cu).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../support.hpp"
#include "cond_device.hpp"
#include "etude/backend/cpu/cpu.hpp"
#include "etude/backend/cpu/executor.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/rng.hpp"
#include "etude/train/trainer.hpp"
#include "step_configs.hpp"
#include "step_device.hpp"

namespace {

namespace st = etude::gpu_test::step;
using etude::index_t;
using conds = st::cond_conditions;
using params_t = st::cond_lm::params;
constexpr int K = st::cond_shape.codebooks;
using cpu_trainer = etude::trainer<st::cond_fp32_config, etude::backend::cpu>;

// 4 examples of 24 frames (two microbatches of 2). Example 0: key and 5 real text positions;
// 1: null key and the text fully padded (no valid condition position); 2: key and one real text
// position; 3: key and all 8 text positions; example 3's last frames padded.
etude::token_batch conditioned_batch(std::uint64_t seed) {
  constexpr index_t batch = 4, frames = 24;
  etude::token_batch b(batch, K, frames);
  etude::rng r(seed);
  for (auto& t : b.tokens) t = static_cast<etude::token_t>(r.below(st::cond_shape.card));
  for (int k = 0; k < K; ++k)
    for (index_t t = 20; t < frames; ++t) b.mask_at(3, k, t) = 0;
  const int real[batch] = {5, 0, 1, 8};
  for (index_t e = 0; e < batch; ++e) {
    b.attributes.push_back(e == 1 ? -1 : static_cast<std::int32_t>(r.below(24)));
    for (int p = 0; p < conds::embedding_positions; ++p) b.embedding_mask.push_back(p < real[e] ? 1 : 0);
  }
  b.embeddings.resize(static_cast<std::size_t>(batch * conds::embedding_values));
  for (auto& x : b.embeddings) x = static_cast<float>(r.uniform(-1.0, 1.0));
  return b;
}

etude::hyper parity_hyper(double dropout) {
  etude::hyper h;
  h.lr = 1e-3;
  h.warmup_steps = 0;
  h.total_steps = 100;
  h.condition_dropout = dropout;  // per sample: both trainers draw the same coins
  return h;
}

double relative(double a, double b) { return std::abs(a - b) / std::abs(b); }

template <class Range>
std::vector<float> as_vector(const Range& r) {
  return std::vector<float>(r.begin(), r.end());
}

template <class Params = params_t>
void check_tensors(const std::vector<float>& got, const std::vector<float>& want, double bound, const char* what) {
  double worst = 0;
  std::string worst_name;
  for (const etude::param_desc& p : Params::entries) {
    const auto off = static_cast<std::size_t>(p.offset), n = static_cast<std::size_t>(p.numel());
    const double e = etude::test::relative_l2(std::span<const float>(got.data() + off, n),
                                              std::span<const float>(want.data() + off, n));
    INFO(what << " of " << etude::param_name(p));
    CHECK(e <= bound);
    if (e > worst) worst = e, worst_name = etude::param_name(p);
  }
  std::printf("%s: largest relative L2 error %.3e (%s), bound %.1e\n", what, worst, worst_name.c_str(), bound);
}

void check_pass(const etude::step_stats& g, const etude::step_stats& c) {
  CHECK(g.tokens == c.tokens);
  CHECK(relative(g.ce, c.ce) <= 1e-5);
  for (std::size_t k = 0; k < static_cast<std::size_t>(K); ++k) CHECK(relative(g.ce_q[k], c.ce_q[k]) <= 1e-5);
  CHECK(relative(g.grad_norm, c.grad_norm) <= 1e-5);
}

}  // namespace

TEST_CASE("conditioned fp32 device step matches the CPU trainer", "[gpu][step][conditions]") {
  const etude::hyper h = parity_hyper(0.3);
  cpu_trainer cpu{h};
  const auto gpu = st::make_cond_fp32(h);
  const auto init = gpu->parameters();
  REQUIRE(init.size() == cpu.parameters().size());
  REQUIRE(std::memcmp(init.data(), cpu.parameters().data(), init.size() * sizeof(float)) == 0);

  const auto batch = conditioned_batch(1);
  check_pass(gpu->loss_and_gradients(batch), cpu.loss_and_gradients(batch));
  check_tensors(gpu->gradients(), as_vector(cpu.gradients()), 1e-4, "conditioned fp32 gradients");

  // three updates, each next batch prefetched while the previous step's results are read
  auto b = conditioned_batch(10);
  for (std::uint64_t s = 0; s < 3; ++s) {
    INFO("step " << s);
    const auto cs = cpu.step(b);
    const auto gs = gpu->step(b);
    CHECK(relative(gs.ce, cs.ce) <= 1e-5);
    CHECK(relative(gs.grad_norm, cs.grad_norm) <= 1e-5);
    b = conditioned_batch(11 + s);
    gpu->prefetch(b);
  }
  check_tensors(gpu->parameters(), as_vector(cpu.parameters()), 1e-4, "conditioned fp32 weights after 3 steps");
}

TEST_CASE("prepended conditions: the fp32 device step matches the CPU trainer", "[gpu][step][conditions]") {
  static_assert(st::prepend_conditions::embedding_values == conds::embedding_values &&
                st::prepend_conditions::attributes == conds::attributes);  // conditioned_batch fits both
  using prepend_params = st::prepend_lm::params;
  const etude::hyper h = parity_hyper(0.3);
  etude::trainer<st::prepend_fp32_config, etude::backend::cpu> cpu{h};
  const auto gpu = st::make_prepend_fp32(h);
  REQUIRE(gpu->parameters().size() == cpu.parameters().size());
  const auto batch = conditioned_batch(4);
  check_pass(gpu->loss_and_gradients(batch), cpu.loss_and_gradients(batch));
  check_tensors<prepend_params>(gpu->gradients(), as_vector(cpu.gradients()), 1e-4, "prepended fp32 gradients");
  for (std::uint64_t s = 0; s < 3; ++s) {
    INFO("step " << s);
    const auto b = conditioned_batch(20 + s);
    const auto cs = cpu.step(b);
    const auto gs = gpu->step(b);
    CHECK(relative(gs.ce, cs.ce) <= 1e-5);
  }
  check_tensors<prepend_params>(gpu->parameters(), as_vector(cpu.parameters()), 1e-4,
                                "prepended fp32 weights after 3 steps");
}

TEST_CASE("summed conditions: the fp32 device step matches the CPU trainer", "[gpu][step][conditions]") {
  using sum_params = st::sum_lm::params;
  const etude::hyper h = parity_hyper(0.3);
  etude::trainer<st::sum_fp32_config, etude::backend::cpu> cpu{h};
  const auto gpu = st::make_sum_fp32(h);
  REQUIRE(gpu->parameters().size() == cpu.parameters().size());
  auto attributes_only = [](std::uint64_t seed) {  // fuse::sum takes no embedding
    etude::token_batch b = conditioned_batch(seed);
    b.embeddings.clear();
    b.embedding_mask.clear();
    return b;
  };
  const auto batch = attributes_only(4);
  check_pass(gpu->loss_and_gradients(batch), cpu.loss_and_gradients(batch));
  check_tensors<sum_params>(gpu->gradients(), as_vector(cpu.gradients()), 1e-4, "summed fp32 gradients");
  for (std::uint64_t s = 0; s < 3; ++s) {
    INFO("step " << s);
    const auto b = attributes_only(30 + s);
    const auto cs = cpu.step(b);
    const auto gs = gpu->step(b);
    CHECK(relative(gs.ce, cs.ce) <= 1e-5);
  }
  check_tensors<sum_params>(gpu->parameters(), as_vector(cpu.parameters()), 1e-4, "summed fp32 weights after 3 steps");
}

TEST_CASE("a prefetched conditioned batch is reused only with the same conditions", "[gpu][step][conditions]") {
  const etude::hyper h = parity_hyper(0.0);
  cpu_trainer cpu{h};
  const auto gpu = st::make_cond_fp32(h);
  const auto batch = conditioned_batch(3);

  // the same tokens with other conditions: the staged slot must not be taken
  for (int change = 0; change < 3; ++change) {
    auto other = batch;
    if (change == 0) other.attributes[0] = (other.attributes[0] + 1) % 24;
    if (change == 1) other.embeddings[5] += 0.5f;
    if (change == 2) other.embedding_mask[conds::embedding_positions] = 1;  // example 1 gains a real text position
    INFO("changed " << (change == 0 ? "attributes" : change == 1 ? "embeddings" : "embedding mask"));
    gpu->prefetch(other);
    check_pass(gpu->loss_and_gradients(batch), cpu.loss_and_gradients(batch));
  }
  // the same batch: taken from the prefetch, with the same result
  gpu->prefetch(batch);
  check_pass(gpu->loss_and_gradients(batch), cpu.loss_and_gradients(batch));
  check_tensors(gpu->gradients(), as_vector(cpu.gradients()), 1e-4, "gradients from a prefetched batch");
}

namespace {

namespace dev = etude::gpu_test;

// Values representable in bf16 when t is bf16 (both backends then see the same inputs).
dev::vec random_values(std::size_t n, std::uint64_t seed, dev::dtype t) {
  etude::rng r(seed);
  dev::vec v(n);
  for (auto& x : v) {
    x = static_cast<float>(r.uniform(-1.0, 1.0));
    if (t == dev::dtype::bf16) x = static_cast<float>(etude::convert<etude::bf16>(x));
  }
  return v;
}

double rel_l2(const dev::vec& a, const dev::vec& b) {
  return etude::test::relative_l2(std::span<const float>(a.data(), a.size()), std::span<const float>(b.data(), b.size()));
}

template <int HD>
void cross_against_cpu(dev::dtype t, bool masked) {
  using cpu = etude::backend::cpu;
  constexpr index_t batch = 3, steps = 37, positions = 70;
  constexpr int heads = 2;
  constexpr index_t d = heads * HD;
  INFO((t == dev::dtype::f32 ? "fp32" : "bf16") << " hd " << HD << (masked ? " masked" : " unmasked"));
  const dev::vec q = random_values(batch * steps * d, 1, t), kv = random_values(batch * positions * 2 * d, 2, t);
  const dev::vec datt = random_values(batch * steps * d, 3, t);
  dev::vec mask;
  if (masked)  // example 0: every other position after 40; example 1: nothing valid; example 2: all
    for (index_t b = 0; b < batch; ++b)
      for (index_t j = 0; j < positions; ++j) mask.push_back(b == 2 || (b == 0 && (j < 40 || j % 2 == 0)) ? 1.0f : 0.0f);
  dev::vec att(q.size()), lse(static_cast<std::size_t>(batch * steps * heads)), dq(q.size()), dkv(kv.size());
  std::vector<float> scratch(
      static_cast<std::size_t>(cpu::cross_attention_scratch(steps, positions, HD, false, cpu::threads())));
  const float* m = masked ? mask.data() : nullptr;
  cpu::cross_attention_fwd<HD>(att.data(), lse.data(), q.data(), kv.data(), m, batch, steps, positions, heads, d,
                               scratch.data(), static_cast<index_t>(scratch.size()));
  cpu::cross_attention_bwd<HD>(dq.data(), dkv.data(), datt.data(), q.data(), kv.data(), lse.data(), m, batch, steps,
                               positions, heads, d, scratch.data(), static_cast<index_t>(scratch.size()));
  const auto got = dev::cross_attention(t, q, kv, mask, datt, batch, steps, positions, heads, HD);
  const auto again = dev::cross_attention(t, q, kv, mask, datt, batch, steps, positions, heads, HD);
  CHECK(std::memcmp(got.dq.data(), again.dq.data(), got.dq.size() * sizeof(float)) == 0);  // no atomics
  CHECK(std::memcmp(got.dkv.data(), again.dkv.data(), got.dkv.size() * sizeof(float)) == 0);
  for (std::size_t i = 0; i < lse.size(); ++i) {
    INFO("lse " << i);
    if (std::isinf(lse[i])) CHECK(std::isinf(got.lse[i]));
    else CHECK(std::abs(got.lse[i] - lse[i]) <= 1e-5 * (1.0 + std::abs(lse[i])));
  }
  // fp32: summation order only. bf16: every stored result rounded once (u = 2^-8, rms ~u/sqrt(3)).
  const double bound = t == dev::dtype::f32 ? 1e-5 : 8e-3;
  CHECK(rel_l2(got.att, att) <= bound);
  CHECK(rel_l2(got.dq, dq) <= bound);
  CHECK(rel_l2(got.dkv, dkv) <= bound);
  if (masked) {  // example 1 attends to nothing: exact zeros, and its keys and values get no gradient
    for (index_t i = steps * d; i < 2 * steps * d; ++i) CHECK(got.att[static_cast<std::size_t>(i)] == 0.0f);
    for (index_t i = positions * 2 * d; i < 2 * positions * 2 * d; ++i) CHECK(got.dkv[static_cast<std::size_t>(i)] == 0.0f);
  }
}

}  // namespace

TEST_CASE("cross-attention on the device matches the CPU's", "[gpu][cross_attention]") {
  for (const auto t : {dev::dtype::f32, dev::dtype::bf16})
    for (const bool masked : {true, false}) {
      cross_against_cpu<64>(t, masked);
      cross_against_cpu<128>(t, masked);
    }
}
