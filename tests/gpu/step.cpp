// The trainer's step on backend::cuda against the same trainer on backend::cpu, the oracle, on
// the same configuration, hyperparameters, batches and initial weights; and the properties of
// the device step itself: a replayed graph computes exactly what eager launches compute, two runs
// are bit-identical, a prefetched batch trains exactly like one handed to step(), the loss scaler
// skips the same steps, the device memory is the plan's, and a small
// model learns. The trainer runs behind step_device.hpp (nvcc); this file is compiled by g++.
//
// Bounds:
//   - fp32: both backends compute in float from identical inputs and differ only in summation
//     order (cuBLASLt vs OpenBLAS, the flash-attention tiles, reduction trees), a few float ulps
//     per operation (~1e-7 relative) that cancellation in the gradient sums can magnify 100×:
//     1e-5 on the loss, 1e-4 on every gradient tensor and on the weights after three steps.
//   - bf16: both store the same tensors rounded to bf16 (unit roundoff u = 2^-8) but their float
//     results straddle a rounding boundary in different places, and the GPU's tensor-core
//     attention also rounds the probabilities and their gradients to bf16 before its products.
//     So each of the ~4L+3 rounded tensors on the path from the embeddings to the loss and back
//     contributes an independent error of at most u (relative, rms); independent errors add in
//     quadrature, and the residual stream correlates them, for which we allow 4× (the bound of
//     the CPU's own bf16-against-fp32 test, tests/config/precision.cpp): 4·sqrt(4L+3)·u ≈ 5.2e-2,
//     on the loss, the whole gradient vector and every gradient tensor. (On the CPU, bf16 against
//     fp32 — a larger difference than bf16 against bf16 — stays below 6.4e-3 on every tensor of
//     this configuration.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../support.hpp"
#include "etude/backend/cpu/executor.hpp"
#include "etude/core/dtype.hpp"
#include "etude/data/synthetic.hpp"
#include "etude/train/trainer.hpp"
#include "step_configs.hpp"
#include "step_device.hpp"

namespace {

namespace st = etude::gpu_test::step;
using etude::index_t;
using params_t = st::lm::params;
constexpr int K = st::shape.codebooks;
constexpr int L = st::shape.layers;

const etude::data::synthetic_tokens& corpus() {
  static const etude::data::synthetic_tokens c{
      {.codebooks = K, .card = st::shape.card, .states = 16, .branching = 2, .repeat = 0.0, .period = 8,
       .fine_noise = 0.1, .seed = 7}};
  return c;
}

// 4 examples of 24 frames (two microbatches of 2); example 1 ends in 6 frames of padding.
etude::token_batch padded_batch(std::uint64_t stream) {
  etude::token_batch b = corpus().sample(4, 24, stream);
  for (int k = 0; k < K; ++k)
    for (index_t t = 18; t < 24; ++t) b.mask_at(1, k, t) = 0;
  return b;
}

etude::hyper parity_hyper() {
  etude::hyper h;
  h.lr = 1e-3;
  h.warmup_steps = 0;
  h.total_steps = 100;
  return h;
}

double relative(double a, double b) { return std::abs(a - b) / std::abs(b); }

template <class A, class B>
double tensor_error(const A& a, const B& b, const etude::param_desc& p) {
  const auto off = static_cast<std::size_t>(p.offset), n = static_cast<std::size_t>(p.numel());
  return etude::test::relative_l2(std::span<const float>(a.data() + off, n), std::span<const float>(b.data() + off, n));
}

template <class A, class B>
double vector_error(const A& a, const B& b) {
  return etude::test::relative_l2(std::span<const float>(a.data(), a.size()), std::span<const float>(b.data(), b.size()));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
template <class Range>
std::vector<float> as_vector(const Range& r) {
  return std::vector<float>(r.begin(), r.end());
}

// Every tensor of a flat (parameter-table order) buffer within `bound` of the reference.
template <class A, class B>
void check_tensors(const A& got, const B& want, double bound, const char* what) {
  double worst = 0;
  std::string worst_name;
  for (const etude::param_desc& p : params_t::entries) {
    const double e = tensor_error(got, want, p);
    INFO(what << " of " << etude::param_name(p));
    CHECK(e <= bound);
    if (e > worst) worst = e, worst_name = etude::param_name(p);
  }
  std::printf("%s: largest relative L2 error %.3e (%s), bound %.1e\n", what, worst, worst_name.c_str(), bound);
}

double bf16_bound() { return 4 * std::sqrt(4.0 * L + 3) * etude::dtype_traits<etude::bf16>::unit_roundoff; }

using maker = std::function<std::unique_ptr<st::device_trainer>(const etude::hyper&)>;

}  // namespace

TEST_CASE("fp32 device step matches the CPU trainer", "[gpu][step]") {
  const etude::hyper h = parity_hyper();
  etude::trainer<st::fp32_config, etude::backend::cpu> cpu{h};
  const auto gpu = st::make_fp32(h);
  REQUIRE(same_bits(gpu->parameters(), as_vector(cpu.parameters())));  // the same initialisation, bit for bit

  const auto batch = padded_batch(1);
  const auto c = cpu.loss_and_gradients(batch);
  const auto g = gpu->loss_and_gradients(batch);
  CHECK(g.tokens == c.tokens);
  CHECK(g.tokens_q == c.tokens_q);
  CHECK(relative(g.ce, c.ce) <= 1e-5);
  for (std::size_t k = 0; k < static_cast<std::size_t>(K); ++k) CHECK(relative(g.ce_q[k], c.ce_q[k]) <= 1e-5);
  CHECK(relative(g.grad_norm, c.grad_norm) <= 1e-5);
  check_tensors(gpu->gradients(), as_vector(cpu.gradients()), 1e-4, "fp32 gradients");

  for (std::uint64_t s = 0; s < 3; ++s) {
    const auto b = padded_batch(10 + s);
    const auto cs = cpu.step(b);
    const auto gs = gpu->step(b);
    INFO("step " << s);
    CHECK(relative(gs.ce, cs.ce) <= 1e-5);
    CHECK(relative(gs.grad_norm, cs.grad_norm) <= 1e-5);
    CHECK(relative(gs.clip_coef, cs.clip_coef) <= 1e-5);
    CHECK(gs.lr == cs.lr);
    CHECK(gs.step == cs.step);
    CHECK(!gs.skipped);
    CHECK(gs.tokens == cs.tokens);
    CHECK(gs.frames == cs.frames);
  }
  CHECK(gpu->steps_done() == 3);
  check_tensors(gpu->parameters(), as_vector(cpu.parameters()), 1e-4, "fp32 weights after 3 steps");
  const std::vector<float> grads = gpu->gradients();
  CHECK(std::all_of(grads.begin(), grads.end(), [](float v) { return v == 0.0f; }));  // cleared by the step

  const auto valid = corpus().sample(6, 24, 99);
  CHECK(relative(gpu->evaluate(valid).ce, cpu.evaluate(valid).ce) <= 1e-5);
}

TEST_CASE("bf16 device step matches the CPU bf16 trainer within bf16 rounding", "[gpu][step]") {
  const etude::hyper h = parity_hyper();
  etude::trainer<st::bf16_config, etude::backend::cpu> cpu{h};
  const auto gpu = st::make_bf16(h);
  REQUIRE(same_bits(gpu->parameters(), as_vector(cpu.parameters())));
  const double bound = bf16_bound();

  const auto batch = padded_batch(2);
  const auto c = cpu.loss_and_gradients(batch);
  const auto g = gpu->loss_and_gradients(batch);
  CHECK(g.tokens == c.tokens);
  CHECK(relative(g.ce, c.ce) <= bound);
  const std::vector<float> gg = gpu->gradients();
  const std::vector<float> cg = as_vector(cpu.gradients());
  const double whole = vector_error(gg, cg);
  std::printf("bf16 gradients: relative L2 error %.3e (bound %.3e), ce %.6f vs %.6f\n", whole, bound, g.ce, c.ce);
  CHECK(whole <= bound);
  check_tensors(gg, cg, bound, "bf16 gradients per tensor");

  // Adam's first update moves each weight by lr·g/(|g| + eps) (plus the decay, the same on both):
  // by lr·sign(g). So the two updates differ by 2·lr where the gradients' signs differ and by
  // next to nothing elsewhere: relative to the CPU's update, 2·lr·sqrt(flips)/‖update‖.
  std::size_t flips = 0;
  for (std::size_t i = 0; i < gg.size(); ++i) flips += (gg[i] > 0) != (cg[i] > 0) || (gg[i] < 0) != (cg[i] < 0);
  const std::vector<float> before = gpu->parameters();
  CHECK(relative(gpu->step(batch).ce, cpu.step(batch).ce) <= bound);  // the same gradients again
  std::vector<float> dg = gpu->parameters(), dc = as_vector(cpu.parameters());
  double norm = 0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    dg[i] -= before[i];
    dc[i] -= before[i];
    norm += static_cast<double>(dc[i]) * dc[i];
  }
  const double predicted = 2 * h.lr * std::sqrt(static_cast<double>(flips)) / std::sqrt(norm);
  const double moved = vector_error(dg, dc);
  std::printf("bf16 first update: relative L2 error %.3e, %zu gradient signs differ (predicted %.3e)\n", moved, flips,
              predicted);
  CHECK(moved <= 1.1 * predicted + 1e-3);
}

TEST_CASE("graph replay computes exactly what eager launches compute", "[gpu][step]") {
  for (const auto& [name, make] : {std::pair<const char*, maker>{"fp32", st::make_fp32}, {"bf16", st::make_bf16}}) {
    INFO(name);
    const etude::hyper h = parity_hyper();
    const auto graphs = make(h);
    const auto eager = make(h);
    eager->use_graphs(false);
    for (std::uint64_t s = 0; s < 5; ++s) {
      const auto b = padded_batch(30 + s);
      const auto a = graphs->step(b);
      const auto e = eager->step(b);
      CHECK(a.ce == e.ce);
      CHECK(a.grad_norm == e.grad_norm);
    }
    CHECK(same_bits(graphs->parameters(), eager->parameters()));
    CHECK(same_bits(graphs->optimizer_state(0), eager->optimizer_state(0)));
    CHECK(same_bits(graphs->optimizer_state(1), eager->optimizer_state(1)));
    CHECK(graphs->cached_graphs() == 1);  // one batch shape, one input slot: steps 2-5 replayed one graph
    CHECK(eager->cached_graphs() == 0);
  }
}

TEST_CASE("activation checkpointing on the device gives bit-identical gradients and weights", "[gpu][step]") {
  // recomputation runs the same kernels on the same inputs, so the bits cannot differ
  const std::pair<maker, maker> pairs[] = {{st::make_fp32, st::make_fp32_every_layer},
                                           {st::make_fp32, st::make_fp32_selective},
                                           {st::make_bf16, st::make_bf16_selective_ffn},
                                           {st::make_fp16, st::make_fp16_every_nth}};
  const char* names[] = {"fp32 none vs every_layer", "fp32 none vs selective", "bf16 none vs selective_ffn",
                         "fp16 none vs every_nth<2>"};
  for (int i = 0; i < 4; ++i) {
    INFO(names[i]);
    const etude::hyper h = parity_hyper();
    const auto plain = pairs[i].first(h);
    const auto recomputed = pairs[i].second(h);
    for (std::uint64_t s = 0; s < 3; ++s) {
      const auto b = padded_batch(50 + s);
      CHECK(plain->step(b).ce == recomputed->step(b).ce);
    }
    const auto b = padded_batch(60);
    CHECK(plain->loss_and_gradients(b).ce == recomputed->loss_and_gradients(b).ce);
    CHECK(same_bits(plain->gradients(), recomputed->gradients()));
    CHECK(same_bits(plain->parameters(), recomputed->parameters()));
    CHECK(same_bits(plain->optimizer_state(1), recomputed->optimizer_state(1)));
  }
}

TEST_CASE("two runs of the device step are bit-identical", "[gpu][step]") {
  for (const auto& [name, make] : {std::pair<const char*, maker>{"fp32", st::make_fp32}, {"bf16", st::make_bf16}}) {
    INFO(name);
    std::vector<float> first;
    std::vector<double> losses[2];
    for (int run = 0; run < 2; ++run) {
      const auto t = make(parity_hyper());
      for (std::uint64_t s = 0; s < 5; ++s) losses[run].push_back(t->step(padded_batch(40 + s)).ce);
      if (run == 0) first = t->parameters();
      else CHECK(same_bits(t->parameters(), first));
    }
    CHECK(losses[0] == losses[1]);
  }
}

TEST_CASE("fp16 loss scaling skips exactly the steps the CPU trainer skips", "[gpu][step]") {
  etude::hyper h = parity_hyper();
  h.loss_scale = std::ldexp(1.0, 40);  // far beyond fp16's 65504: the first steps must overflow
  h.scale_interval = 1000;
  etude::trainer<st::fp16_config, etude::backend::cpu> cpu{h};
  const auto gpu = st::make_fp16(h);
  const double bound = 4 * std::sqrt(4.0 * L + 3) * etude::dtype_traits<etude::fp16>::unit_roundoff;
  int skipped = 0;
  for (int i = 0; i < 30; ++i) {
    const auto b = padded_batch(200 + static_cast<std::uint64_t>(i));
    const std::vector<float> before = gpu->parameters();
    const auto c = cpu.step(b);
    const auto g = gpu->step(b);
    INFO("step " << i << " at scale 2^" << std::log2(c.scale));
    REQUIRE(g.skipped == c.skipped);
    CHECK(g.scale == c.scale);
    CHECK(g.step == c.step);
    CHECK(g.lr == c.lr);
    CHECK(g.skipped_steps == c.skipped_steps);
    CHECK(relative(g.ce, c.ce) <= bound);
    if (g.skipped) {
      ++skipped;
      CHECK(same_bits(gpu->parameters(), before));  // a skipped step changes no weight
    }
  }
  std::printf("fp16: %d of 30 steps skipped from scale 2^40, scale now 2^%d\n", skipped,
              static_cast<int>(std::log2(gpu->loss_scale())));
  CHECK(skipped >= 10);
  CHECK(gpu->loss_scale() == cpu.loss_scale());
  CHECK(gpu->skipped_steps() == cpu.skipped_steps());
  CHECK(gpu->steps_done() == cpu.steps_done());
}

TEST_CASE("a prefetched batch trains exactly like one handed to step()", "[gpu][step]") {
  const etude::hyper h = parity_hyper();
  const auto ahead = st::make_fp32(h);
  const auto plain = st::make_fp32(h);
  std::vector<etude::token_batch> batches;
  for (std::uint64_t s = 0; s < 6; ++s) batches.push_back(padded_batch(50 + s));
  ahead->prefetch(batches[0]);
  for (std::size_t i = 0; i < 5; ++i) {
    ahead->prefetch(batches[i + 1]);  // copied while batch i trains
    CHECK(ahead->step(batches[i]).ce == plain->step(batches[i]).ce);
  }
  CHECK(same_bits(ahead->parameters(), plain->parameters()));
  CHECK(ahead->cached_graphs() == 2);  // the steps alternated between the two input slots

  // a batch stepped while another is staged, and a staged batch changed before its step
  auto other = padded_batch(70);
  CHECK(ahead->step(other).ce == plain->step(other).ce);
  batches[5].at(0, 0, 3) = (batches[5].at(0, 0, 3) + 1) % st::shape.card;
  CHECK(ahead->step(batches[5]).ce == plain->step(batches[5]).ce);
  CHECK(same_bits(ahead->parameters(), plain->parameters()));
}

TEST_CASE("the device memory is the memory plan's", "[gpu][step]") {
  const auto gpu = st::make_fp32(parity_hyper());
  for (std::uint64_t s = 0; s < 3; ++s) gpu->step(padded_batch(80 + s));  // eager warm-up, capture, replay
  const st::memory_report r = gpu->memory(2, 24);
  // The plan counts the batch as the loader hands it over (tokens and mask) and the pattern
  // tables among its inputs: here they stay on the host. The device holds in their place one
  // input slot (both microbatches' sequences and targets, staged for the copy stream), the
  // context's op scratch (the embedding backward's sort, per-row losses, reduction partials),
  // which backend::cuda's plan does not count, and the two control structs.
  const index_t expected = r.plan_total - r.plan_host_inputs + r.input_staging + r.op_scratch + r.control;
  std::printf("device memory: peak %lld bytes, plan %lld (host inputs %lld), staging %lld, scratch %lld, control %lld\n",
              static_cast<long long>(r.measured.peak_allocated), static_cast<long long>(r.plan_total),
              static_cast<long long>(r.plan_host_inputs), static_cast<long long>(r.input_staging),
              static_cast<long long>(r.op_scratch), static_cast<long long>(r.control));
  CHECK(r.measured.peak_allocated == expected);
  CHECK(r.measured.peak_reserved == r.measured.peak_allocated);  // one shape: every buffer is in use
  CHECK(r.input_staging > 0);
}

TEST_CASE("bad batches are refused with the CPU trainer's messages", "[gpu][step]") {
  const etude::hyper h = parity_hyper();
  etude::trainer<st::fp32_config, etude::backend::cpu> cpu{h};
  const auto gpu = st::make_fp32(h);
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const etude::invalid_input& e) {
      return e.what();
    }
    return "(nothing thrown)";
  };
  std::vector<etude::token_batch> bad;
  bad.push_back(padded_batch(90));
  bad.back().at(1, 2, 3) = st::shape.card;       // token outside the codebook
  bad.push_back(corpus().sample(3, 24, 91));     // 3 examples do not split into accumulate<2>
  bad.push_back(corpus().sample(2, 200, 92));    // beyond max_len
  bad.push_back(padded_batch(93));
  for (index_t e = 0; e < 4; ++e)
    for (index_t t = 0; t < 24; ++t) bad.back().mask_at(e, 2, t) = 0;  // codebook 2 all padding
  for (const auto& b : bad) {
    const std::string want = message([&] { cpu.step(b); });
    INFO(want);
    CHECK(want != "(nothing thrown)");
    CHECK(message([&] { gpu->step(b); }) == want);
    gpu->prefetch(b);  // staged nowhere: step() reports it
    CHECK(message([&] { gpu->step(b); }) == want);
  }
  CHECK(gpu->steps_done() == 0);
  // a non-finite loss: the same error, and nothing changed
  std::vector<float> w = gpu->parameters();
  w[static_cast<std::size_t>(params_t::at(etude::param_kind::head, -1, 0).offset)] = NAN;
  gpu->set_parameters(w);
  cpu.parameters_for_write()[static_cast<std::size_t>(params_t::at(etude::param_kind::head, -1, 0).offset)] = NAN;
  std::string cpu_error, gpu_error;
  const auto b = padded_batch(94);
  try {
    cpu.step(b);
  } catch (const etude::non_finite& e) {
    cpu_error = e.what();
  }
  try {
    gpu->step(b);
  } catch (const etude::non_finite& e) {
    gpu_error = e.what();
  }
  CHECK(!cpu_error.empty());
  CHECK(gpu_error == cpu_error);
  CHECK(same_bits(gpu->parameters(), w));
  const std::vector<float> grads = gpu->gradients();
  CHECK(std::all_of(grads.begin(), grads.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("the device step learns the synthetic corpus", "[gpu][step][learning]") {
  etude::hyper h;
  h.lr = 1e-2;
  h.warmup_steps = 10;
  h.total_steps = 100;
  h.weight_decay = 0.0;
  const auto gpu = st::make_fp32(h);
  const auto valid = corpus().sample(16, 32, 1u << 20);
  const double start = gpu->evaluate(valid).ce;
  for (std::uint64_t s = 0; s < 100; ++s) gpu->step(corpus().sample(8, 32, s));
  const double end = gpu->evaluate(valid).ce;
  std::printf("device learning: validation ce %.4f -> %.4f (%.1f%%)\n", start, end, 100.0 * end / start);
  CHECK(end < 0.7 * start);
}
