// Generation on backend::cuda against backend::cpu, the oracle, on the same inputs: the key/value
// cache ops (every storage dtype, both head dimensions, a cache of one row and a full cache, odd
// lengths, several sequences); etude::decoder on step_configs.hpp's models and the same random
// weights (a prefill, then single steps fed the CPU's greedy tokens, then a reset and a prefill of
// one step; without conditions, with cross-attention and with prepended conditions); and
// etude::generator, whose sampling runs on the host (generate/sampling.hpp) from the logits the
// device computes, so the device's tokens must be the CPU's for greedy decoding and for sampling
// with a fixed seed. The device side is behind generate_device.hpp (nvcc); this file is compiled
// by g++.
//
// Bounds:
//   - kv_append is a copy with one conversion: bit for bit.
//   - cached_attention, fp32: a score is a dot product of hd terms |q_j k_j| <= 1, so two summation
//     orders differ by at most 2·hd·2^-24·hd, scaled by 1/sqrt(hd): δ = 2·hd^1.5·2^-24. δ moves the
//     softmax weights by at most 2δ relative, and the output (|v| <= 1) by 2δ; exp and the
//     weighted sums add a few ulp: 4·hd^1.5·2^-24 + 1e-6. A 16-bit output is rounded once on each
//     side: 2u·|want| more.
//   - decoder, fp32: both compute in float from the same weights and tokens and differ only in
//     summation order (cuBLASLt against CBLAS, flash attention and the cache kernel's online
//     softmax against the CPU's two passes, reduction trees): a few float ulps per op, which
//     LayerNorm and two layers magnify; 1e-5 on |Δ| / (1 + |want|), the bound the CPU's own cached
//     decode keeps against its full forward (tests/generate/generate.cpp), where only the order of the
//     sums differs too. The greedy tokens must then be identical: the smallest top-2 margin of the
//     CPU's logits is printed, to show how far from a tie they were.
//   - decoder, bf16: both store every activation rounded to bf16 (u = 2^-8), rounding float
//     results that straddle a boundary differently; as step.cpp, 4·sqrt(4L+3)·u ≈ 5.2e-2 relative
//     L2 on each pass's logits of each codebook. Greedy ties are possible at bf16 resolution: the
//     bf16 tokens are reported, not required to agree.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../support.hpp"
#include "etude/backend/cpu/cpu.hpp"
#include "etude/backend/cpu/executor.hpp"
#include "etude/core/dtype.hpp"
#include "etude/core/rng.hpp"
#include "etude/generate/decoder.hpp"
#include "etude/generate/generator.hpp"
#include "etude/train/detail/step_rules.hpp"
#include "generate_device.hpp"
#include "host_util.hpp"

namespace {

namespace st = etude::gpu_test::step;
namespace gen = etude::gpu_test::gen;
using etude::index_t;
using etude::token_t;
using etude::gpu_test::dtype;
using etude::gpu_test::vec;
using cpu = etude::backend::cpu;

using etude::gpu_test::host_dispatch;
using etude::gpu_test::name;
using etude::gpu_test::with_cpu_head_dim;

// The rounding of a result stored in dtype t (unit roundoff; none for fp32, the compute type).
double store_roundoff(dtype t) { return t == dtype::f32 ? 0.0 : etude::gpu_test::unit_roundoff(t); }

float round_to(dtype t, float x) {
  return host_dispatch(t, [&](auto tag) { return static_cast<float>(etude::convert<decltype(tag)>(x)); });
}

vec uniform(std::size_t n, float lo, float hi, std::uint64_t seed, dtype t) {
  etude::rng r(seed);
  vec v(n);
  for (float& x : v) x = round_to(t, static_cast<float>(r.uniform(lo, hi)));
  return v;
}

template <class T>
std::vector<T> narrow(const vec& x) {
  std::vector<T> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = etude::convert<T>(x[i]);
  return out;
}
template <class T>
vec widen(const std::vector<T>& x) {
  vec out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(x[i]);
  return out;
}

// |got − want| <= atol + rtol·|want| everywhere; reports the first few violations.
void check_close(const vec& got, const vec& want, double rtol, double atol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    if (!(err <= atol + rtol * std::fabs(want[i]))) {  // NaN fails too
      if (bad < 5)
        first += "\n  [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " + std::to_string(want[i]);
      ++bad;
    }
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements outside the bound" << first);
  CHECK(bad == 0);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const etude::error& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- the ops ----------------------------------------------------------------------------------------

struct kv_case {
  index_t batch, n, at, max_steps, dim;
};

void kv_append_against_cpu(dtype cache_t, dtype act_t, const kv_case& c) {
  const std::string what = std::string("kv_append cache ") + name(cache_t) + " from " + name(act_t) + ": B " +
                           std::to_string(c.batch) + " n " + std::to_string(c.n) + " at " + std::to_string(c.at) +
                           " M " + std::to_string(c.max_steps) + " D " + std::to_string(c.dim);
  // the rows outside at .. at + n − 1 hold values the append must leave alone; qkv is drawn in
  // its own dtype, so an fp32 source exercises the rounding to a 16-bit cache
  const vec cache_in = uniform(static_cast<std::size_t>(c.batch * c.max_steps * 2 * c.dim), -4, 4, 70, cache_t);
  const vec qkv = uniform(static_cast<std::size_t>(c.batch * c.n * 3 * c.dim), -4, 4, 71, act_t);
  const vec want = host_dispatch(cache_t, [&](auto cache_tag) {
    return host_dispatch(act_t, [&](auto act_tag) {
      auto cache = narrow<decltype(cache_tag)>(cache_in);
      const auto q = narrow<decltype(act_tag)>(qkv);
      cpu::kv_append(cache.data(), q.data(), c.batch, c.n, c.at, c.max_steps, c.dim);
      return widen(cache);
    });
  });
  const vec got = gen::kv_append(cache_t, act_t, cache_in, qkv, c.batch, c.n, c.at, c.max_steps, c.dim);
  INFO(what);
  CHECK(etude::test::same_bits(got, want));
  CHECK(!etude::test::same_bits(want, cache_in));  // the append wrote something
}

struct cached_case {
  index_t batch, len, max_steps;
  int heads;
  index_t head_dim;
};

void cached_attention_against_cpu(dtype act_t, dtype cache_t, const cached_case& c) {
  const index_t d = c.heads * c.head_dim;
  const std::string what = std::string("cached_attention ") + name(act_t) + " over a " + name(cache_t) +
                           " cache: B " + std::to_string(c.batch) + " len " + std::to_string(c.len) + " M " +
                           std::to_string(c.max_steps) + " H " + std::to_string(c.heads) + " hd " +
                           std::to_string(c.head_dim);
  const vec qkv = uniform(static_cast<std::size_t>(c.batch * 3 * d), -1, 1, 80, act_t);
  // rows at len and beyond hold 30s: a kernel that reads one of them is off by orders of magnitude
  vec cache_in = uniform(static_cast<std::size_t>(c.batch * c.max_steps * 2 * d), -1, 1, 81, cache_t);
  for (index_t b = 0; b < c.batch; ++b)
    for (index_t s = c.len; s < c.max_steps; ++s)
      std::fill_n(cache_in.begin() + (b * c.max_steps + s) * 2 * d, 2 * d, 30.0f);
  const vec want = host_dispatch(act_t, [&](auto act_tag) {
    using A = decltype(act_tag);
    return host_dispatch(cache_t, [&](auto cache_tag) {
      using C = decltype(cache_tag);
      const auto q = narrow<A>(qkv);
      const auto cache = narrow<C>(cache_in);
      std::vector<A> att(static_cast<std::size_t>(c.batch * d));
      std::vector<float> scratch(static_cast<std::size_t>(cpu::cached_attention_scratch(c.max_steps, c.heads, cpu::threads())));
      with_cpu_head_dim(c.head_dim, [&](auto hd) {
        cpu::cached_attention<decltype(hd)::value>(att.data(), q.data(), cache.data(), c.batch, c.len, c.max_steps,
                                                   c.heads, scratch.data(), static_cast<index_t>(scratch.size()));
      });
      return widen(att);
    });
  });
  const vec got = gen::cached_attention(act_t, cache_t, qkv, cache_in, c.batch, c.len, c.max_steps, c.heads, c.head_dim);
  const double hd = static_cast<double>(c.head_dim);
  const double fp32 = 4 * hd * std::sqrt(hd) * 0x1p-24 + 1e-6;
  check_close(got, want, 2 * store_roundoff(act_t), fp32, what);
  const vec again = gen::cached_attention(act_t, cache_t, qkv, cache_in, c.batch, c.len, c.max_steps, c.heads, c.head_dim);
  INFO(what);
  CHECK(etude::test::same_bits(got, again));  // no atomics: the same bits every run
}

// ---- the decoder --------------------------------------------------------------------------------------

// The initialisation the trainers use, with the LayerNorm parameters moved off 1 and 0 so the
// comparison sees them, rounded to the policy's storage type `t`.
template <class Params>
vec random_weights(std::uint64_t seed, dtype t) {
  vec w(static_cast<std::size_t>(Params::total_elements));
  etude::detail::initialise_parameters<Params>(w.data(), seed);
  etude::rng r(seed, 99);
  for (const etude::param_desc& e : Params::entries)
    if (e.is_vector())
      for (index_t i = 0; i < e.numel(); ++i) w[static_cast<std::size_t>(e.offset + i)] += 0.2f * static_cast<float>(r.normal());
  for (float& x : w) x = round_to(t, x);
  return w;
}

// Condition inputs (core/batch.hpp's layout) of step_configs.hpp's conditions for `rows` rows:
// row 0 a key and 5 real text positions; row 1 a null key and no real text position (its
// cross-attention attends to nothing); every further row a key and all 8 positions.
struct condition_rows {
  using conds = st::cond_conditions;
  std::vector<std::int32_t> index;
  std::vector<float> embeddings;
  std::vector<unsigned char> mask;
  explicit condition_rows(index_t rows) {
    etude::rng r(21);
    for (index_t e = 0; e < rows; ++e) {
      index.push_back(e == 1 ? -1 : static_cast<std::int32_t>(r.below(24)));
      const int real = e == 0 ? 5 : e == 1 ? 0 : 8;
      for (int p = 0; p < conds::embedding_positions; ++p) mask.push_back(p < real ? 1 : 0);
      for (long long i = 0; i < conds::embedding_values; ++i) embeddings.push_back(static_cast<float>(r.uniform(-1, 1)));
    }
  }
};

index_t argmax(const float* x, index_t n) { return static_cast<index_t>(std::max_element(x, x + n) - x); }
double top2_margin(const float* x, index_t n) {
  std::vector<float> v(x, x + n);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
  return static_cast<double>(v[0]) - static_cast<double>(v[1]);
}

template <class Model, class Policy>
void decode_against_cpu(gen::model_kind kind, dtype policy, bool conditioned, const char* what) {
  using W = typename Policy::param_t;
  constexpr etude::shape S = Model::shape;
  constexpr int K = S.codebooks;
  constexpr index_t C = S.card;
  constexpr bool fp32 = std::is_same_v<W, float>;
  const index_t rows = 3, max_steps = 13, prefill = 5;
  const double fp32_bound = 1e-5;
  const double bf16_bound = 4 * std::sqrt(4.0 * S.layers + 3) * etude::dtype_traits<etude::bf16>::unit_roundoff;

  const vec w = random_weights<typename Model::params>(5, policy);
  const auto w_cpu = narrow<W>(w);
  etude::decoder<Model, cpu, Policy> host(std::span<const W>(w_cpu), rows, max_steps, prefill);
  const auto device = gen::make_decoder(kind, policy, w, rows, max_steps, prefill);
  if (conditioned) {
    const condition_rows in(rows);
    host.set_conditions(in.index.data(), in.embeddings.data(), in.mask.data());
    device->set_conditions(in.index.data(), in.embeddings.data(), in.mask.data());
  }

  double worst = 0, min_margin = std::numeric_limits<double>::infinity();
  long greedy = 0, agree = 0;
  vec want(static_cast<std::size_t>(rows * prefill * C)), got(want.size());
  // codebook k's logits of the last pass (n positions per row) on both sides, compared
  auto compare = [&](int k, index_t n, bool last_only, const std::string& pass) {
    const std::size_t m = static_cast<std::size_t>(rows * (last_only ? 1 : n) * C);
    want.assign(m, 0.0f);
    got.assign(m, -1.0f);
    if (last_only) {
      host.last_logits(k, want.data());
      device->last_logits(k, got.data());
    } else {
      host.logits(k, want.data());
      device->logits(k, got.data());
    }
    INFO(what << ", " << pass << ", codebook " << k);
    if constexpr (fp32) {
      double e = 0;
      for (std::size_t i = 0; i < m; ++i)
        e = std::max(e, std::fabs(static_cast<double>(got[i]) - want[i]) / (1.0 + std::fabs(want[i])));
      CHECK(e <= fp32_bound);
      worst = std::max(worst, e);
    } else {
      const double e = etude::test::relative_l2(std::span<const float>(got), std::span<const float>(want));
      CHECK(e <= bf16_bound);
      worst = std::max(worst, e);
    }
  };
  // the next step's tokens: each row's argmax of each codebook's last logits on the CPU, which
  // the device's argmax must equal (fp32)
  std::vector<token_t> next(static_cast<std::size_t>(rows * K));
  auto greedy_step = [&](const std::string& pass) {
    for (int k = 0; k < K; ++k) {
      compare(k, 1, true, pass);
      for (index_t r = 0; r < rows; ++r) {
        const float* h = want.data() + r * C;
        const index_t tok = argmax(h, C);
        next[static_cast<std::size_t>(r * K + k)] = static_cast<token_t>(tok);
        min_margin = std::min(min_margin, top2_margin(h, C));
        ++greedy;
        agree += argmax(got.data() + r * C, C) == tok;
        if constexpr (fp32) {
          INFO(what << ", " << pass << ", row " << r << ", codebook " << k);
          CHECK(argmax(got.data() + r * C, C) == tok);
        }
      }
    }
  };

  // a prompt of `prefill` steps with special tokens (id C) among the codebook entries
  std::vector<token_t> prompt(static_cast<std::size_t>(rows * K * prefill));
  etude::rng r(31);
  for (auto& t : prompt) t = static_cast<token_t>(r.below(C + 1));
  host.prefill(prompt.data(), prefill);
  device->prefill(prompt.data(), prefill);
  for (int k = 0; k < K; ++k) compare(k, prefill, false, "prefill");
  greedy_step("prefill");
  for (index_t s = prefill; s < max_steps; ++s) {
    host.step(next.data());
    device->step(next.data());
    greedy_step("step " + std::to_string(s));
  }
  CHECK(host.length() == max_steps);
  CHECK(device->length() == max_steps);
  // a full cache is refused on both sides
  CHECK(error_of([&] { device->step(next.data()); }).find("the cache is full") != std::string::npos);

  // reset: a prefill of one step (attention over one position), then single steps again
  host.reset();
  device->reset();
  CHECK(device->length() == 0);
  std::vector<token_t> first(static_cast<std::size_t>(rows * K));
  for (index_t i = 0; i < rows * K; ++i) first[static_cast<std::size_t>(i)] = prompt[static_cast<std::size_t>(i * prefill)];
  host.prefill(first.data(), 1);
  device->prefill(first.data(), 1);
  for (int k = 0; k < K; ++k) compare(k, 1, false, "prefill of one step after reset");
  greedy_step("prefill of one step after reset");
  for (index_t s = 1; s < 4; ++s) {
    host.step(next.data());
    device->step(next.data());
    greedy_step("step " + std::to_string(s) + " after reset");
  }
  CHECK(device->length() == 4);
  std::printf("decoder %s: largest logit error %.3e (bound %.1e, %s); CPU and device argmax agree in %ld of %ld, "
              "smallest top-2 margin of the CPU's logits %.3e\n",
              what, worst, fp32 ? fp32_bound : bf16_bound, fp32 ? "|d|/(1+|want|)" : "relative L2", agree, greedy,
              min_margin);
}

// ---- the generator ------------------------------------------------------------------------------------

etude::generation_options options(index_t batch, index_t frames, std::uint64_t seed) {
  etude::generation_options o;
  o.batch = batch;
  o.frames = frames;
  o.seed = seed;
  return o;
}

template <class Model>
void generate_against_cpu(gen::model_kind kind, const etude::generation_options& o, const etude::token_batch* prompt,
                          std::span<const etude::condition_input> conditions, const std::string& what) {
  const vec w = random_weights<typename Model::params>(9, dtype::f32);
  etude::generator<Model, cpu> host{std::span<const float>(w)};
  const etude::batch_view view = prompt != nullptr ? prompt->view() : etude::batch_view{};
  const etude::batch_view* p = prompt != nullptr ? &view : nullptr;
  const etude::token_batch want = host.generate(o, p, conditions);
  const etude::token_batch got = gen::generate(kind, w, o, p, conditions);
  INFO(what);
  REQUIRE(got.batch == want.batch);
  REQUIRE(got.frames == want.frames);
  index_t differ = 0;
  for (std::size_t i = 0; i < want.tokens.size(); ++i) differ += got.tokens[i] != want.tokens[i];
  INFO(differ << " of " << want.tokens.size() << " tokens differ");
  CHECK(differ == 0);
}

}  // namespace

TEST_CASE("kv_append copies k and v bit for bit, converting to the cache's dtype", "[gpu][generate][kv_cache]") {
  const std::vector<kv_case> cases = {
      {3, 1, 0, 5, 64},    // one step into an empty cache
      {2, 7, 0, 7, 128},   // a prefill that fills the cache exactly
      {3, 1, 12, 13, 64},  // the last row
      {2, 5, 4, 11, 24},   // rows in the middle, odd lengths, a width no multiple of 32
  };
  for (dtype cache_t : {dtype::f32, dtype::bf16, dtype::f16})
    for (dtype act_t : {dtype::f32, dtype::bf16, dtype::f16})
      for (const auto& c : cases) kv_append_against_cpu(cache_t, act_t, c);
  // rows beyond the cache are refused on both sides
  const vec cache(2 * 4 * 2 * 8), qkv(2 * 2 * 3 * 8);
  CHECK(error_of([&] { gen::kv_append(dtype::f32, dtype::f32, cache, qkv, 2, 2, 3, 4, 8); }).find("do not fit") !=
        std::string::npos);
  std::vector<float> c(cache.size());
  CHECK(error_of([&] { cpu::kv_append(c.data(), qkv.data(), 2, 2, 3, 4, 8); }).find("do not fit") != std::string::npos);
}

TEST_CASE("cached_attention matches the CPU's for both head dimensions, len 1 and len M", "[gpu][generate][kv_cache]") {
  const std::vector<cached_case> cases = {
      {3, 1, 6, 2, 64},      // len 1: the new row alone
      {2, 37, 37, 2, 64},    // len = M, odd
      {2, 3, 8, 1, 128},     // fewer rows than the kernel's warps: some warps see none
      {1, 130, 131, 1, 128}, // many rows per warp, a ragged end
  };
  const std::vector<std::pair<dtype, dtype>> types = {
      {dtype::f32, dtype::f32}, {dtype::bf16, dtype::bf16}, {dtype::f16, dtype::f16},
      {dtype::f32, dtype::bf16},  // (activations, cache): an fp32 query over a 16-bit cache
      {dtype::bf16, dtype::f32},
  };
  for (const auto& [act_t, cache_t] : types)
    for (const auto& c : cases) cached_attention_against_cpu(act_t, cache_t, c);
  // lengths outside 1 .. M are refused
  const vec qkv(3 * 64), cache(4 * 2 * 64);
  CHECK(error_of([&] { gen::cached_attention(dtype::f32, dtype::f32, qkv, cache, 1, 0, 4, 1, 64); }).find("cache length") !=
        std::string::npos);
  CHECK(error_of([&] { gen::cached_attention(dtype::f32, dtype::f32, qkv, cache, 1, 5, 4, 1, 64); }).find("cache length") !=
        std::string::npos);
}

TEST_CASE("the fp32 device decoder gives the CPU decoder's logits and greedy tokens", "[gpu][generate]") {
  decode_against_cpu<st::lm, etude::precision::fp32>(gen::model_kind::plain, dtype::f32, false, "fp32");
}

TEST_CASE("the bf16 device decoder stays within bf16 rounding of the CPU's", "[gpu][generate]") {
  decode_against_cpu<st::lm, etude::precision::bf16>(gen::model_kind::plain, dtype::bf16, false, "bf16");
}

TEST_CASE("conditioned fp32 device decoders match the CPU's: cross-attention and prepended conditions",
          "[gpu][generate][conditions]") {
  decode_against_cpu<st::cond_lm, etude::precision::fp32>(gen::model_kind::cross, dtype::f32, true,
                                                          "fp32 cross-attention");
  decode_against_cpu<st::prepend_lm, etude::precision::fp32>(gen::model_kind::prepend, dtype::f32, true,
                                                             "fp32 prepended conditions");
}

TEST_CASE("the device generator samples the CPU's tokens: greedy, and seeded with top-k and top-p", "[gpu][generate]") {
  // sampling draws on the host from the downloaded logits (generate/sampling.hpp): the same seed
  // gives the same tokens unless a draw falls within a float rounding of a boundary
  etude::token_batch prompt(2, st::shape.codebooks, 4);
  etude::rng r(41);
  for (auto& t : prompt.tokens) t = static_cast<token_t>(r.below(st::shape.card));
  auto greedy = options(2, 10, 3);
  greedy.sampling.greedy = true;
  generate_against_cpu<st::lm>(gen::model_kind::plain, greedy, nullptr, {}, "greedy from nothing");
  generate_against_cpu<st::lm>(gen::model_kind::plain, greedy, &prompt, {}, "greedy with a prompt");
  generate_against_cpu<st::lm>(gen::model_kind::plain, options(2, 10, 3), &prompt, {}, "top-k 250, seed 3");
  auto nucleus = options(3, 9, 5);
  nucleus.sampling.top_p = 0.9;
  nucleus.sampling.temperature = 0.8;
  generate_against_cpu<st::lm>(gen::model_kind::plain, nucleus, nullptr, {}, "top-p 0.9 at temperature 0.8, seed 5");
}

TEST_CASE("the device generator with conditions and guidance samples the CPU's tokens", "[gpu][generate][conditions]") {
  using conds = st::cond_conditions;
  etude::condition_input a, b;
  a.attributes = {3};
  a.embeddings.resize(static_cast<std::size_t>(conds::embedding_values));
  etude::rng r(42);
  for (float& x : a.embeddings) x = static_cast<float>(r.uniform(-1, 1));
  a.embedding_mask.assign(static_cast<std::size_t>(conds::embedding_positions), 0);
  std::fill_n(a.embedding_mask.begin(), 5, 1);
  b.attributes = {17};  // no embedding: the null text
  const std::vector<etude::condition_input> ab{a, b};
  auto o = options(2, 8, 7);
  generate_against_cpu<st::cond_lm>(gen::model_kind::cross, o, nullptr, ab, "cross-attention, seed 7");
  o.cfg_coef = 3.0;  // conditional and null rows decoded together
  generate_against_cpu<st::cond_lm>(gen::model_kind::cross, o, nullptr, ab, "cross-attention guided, seed 7");
  o.sampling.greedy = true;
  generate_against_cpu<st::prepend_lm>(gen::model_kind::prepend, o, nullptr, ab, "prepended, guided, greedy");
}
