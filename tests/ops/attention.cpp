// Causal self-attention, written once for every backend (the category file ETUDE_OPS_CATEGORY names
// it: tests/ops/category_cpu.hpp in test_ops, category_cuda.hpp in test_gpu_ops and test_sim_ops):
// forward and backward in f32, bf16 and fp16, both head dimensions CUDA supports, lengths that are
// no multiple of any tile, against the CPU's double path on the same values (itself checked below),
// within bounds from the dtype, and the backward the same bits every run. On the CPU only: the
// forward against a naive softmax over the past, the backward against central differences, in
// double; bf16 tensors on each product path within the rounding of the probabilities and dS; the
// score rows' kernels. Cross-attention's bf16 path is tests/ops/cross_attention.cpp's. CUDA's own
// question (a head dimension it does not support) is in tests/gpu/ops.cpp.
#include ETUDE_OPS_CATEGORY

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>

#include "ops/bf16_attention.hpp"
#include "ops/oracle.hpp"

#ifdef TEST_BACKEND_CPU
#include <etude/etude.hpp>

#include "product_paths.hpp"
#endif

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

namespace {

struct attention_case {
  index_t batch, steps;
  int heads;
  index_t head_dim;
};

// The CPU's double path on qkv's values, for head dimension HeadDim: the output, log-sum-exp and
// the gradient of datt.
struct attention_exact {
  std::vector<double> att, lse, dqkv;
};
template <int HeadDim>
attention_exact exact_attention(const vec& qkv, const vec& datt, const attention_case& c) {
  const auto q = as_double(qkv), d = as_double(datt);
  attention_exact r{std::vector<double>(datt.size()), std::vector<double>(static_cast<std::size_t>(c.batch * c.steps * c.heads)),
                    std::vector<double>(qkv.size())};
  std::vector<double> scratch(static_cast<std::size_t>(cpu::attention_scratch(c.steps, HeadDim, false, cpu::threads())));
  cpu::attention_fwd<HeadDim>(r.att.data(), r.lse.data(), q.data(), c.batch, c.steps, c.heads, scratch.data(),
                              static_cast<index_t>(scratch.size()));
  cpu::attention_bwd<HeadDim>(r.dqkv.data(), d.data(), r.att.data(), q.data(), r.lse.data(), c.batch, c.steps, c.heads,
                              scratch.data(), static_cast<index_t>(scratch.size()));
  return r;
}

void attention_against_exact(dtype t, const attention_case& c) {
  const index_t d = c.heads * c.head_dim, rows = c.batch * c.steps;
  const double u = unit_roundoff(t);
  const std::string what = std::string(TEST_BACKEND_NAME " ") + name(t) + " hd " + std::to_string(c.head_dim) + " S " +
                           std::to_string(c.steps) + " B " + std::to_string(c.batch) + " H " + std::to_string(c.heads);
  const vec qkv = uniform(static_cast<std::size_t>(rows * 3 * d), -1, 1, 60, t);
  const vec datt = uniform(static_cast<std::size_t>(rows * d), -1, 1, 61, t);
  const auto want = c.head_dim == 64 ? exact_attention<64>(qkv, datt, c) : exact_attention<128>(qkv, datt, c);
  const auto out = TEST_BACKEND::attention_fwd(t, qkv, c.batch, c.steps, c.heads, c.head_dim);
  // fp32: scores differ by <= hd·2^-24·Σ|q k|·scale (<= 2e-5 here), which moves p relatively and
  // O = Σ p v (|v| <= 1) by as much. 16-bit: p is rounded to the storage type before P·V (<= u·max|v|)
  // and O once more on store (u·|O|).
  const double fp32 = 3e-5;
  check_close(out.att, as_float(want.att), u, fp32 + (t == dtype::f32 ? 0.0 : u), "attention_fwd att " + what);
  check_close(out.lse, as_float(want.lse), 1e-6, fp32, "attention_fwd lse " + what);

  const vec got = TEST_BACKEND::attention_bwd(t, datt, qkv, out.lse, {}, c.batch, c.steps, c.heads, c.head_dim);
  const vec with_o = TEST_BACKEND::attention_bwd(t, datt, qkv, out.lse, out.att, c.batch, c.steps, c.heads, c.head_dim);
  const vec again = TEST_BACKEND::attention_bwd(t, datt, qkv, out.lse, {}, c.batch, c.steps, c.heads, c.head_dim);
  CHECK(bit_identical(got, again));  // no atomics: the same bits every run
  // Bound per element of dQ, dK, dV: each is a sum over up to S terms, each carrying at most two
  // roundings of relative u (P or dS to the storage type, and the stored result); errors of
  // random sign over the sum scale like the rms of the tensor (σ ≈ u·rms; the largest of ~10^5
  // checked elements reaches ~4.5σ), so the bound is 8u·(|ref| + rms(ref)) + the fp32 reordering
  // term (scaled by the tensor's rms and sqrt(S)). A wrong index or mask gives O(1) errors.
  // The variant with O has a different delta (dO·O from the stored O): 2u·rms more for 16-bit.
  for (int part = 0; part < 3; ++part) {
    double ss = 0;
    std::size_t count = 0;
    for (index_t r = 0; r < rows; ++r)
      for (index_t j = 0; j < d; ++j, ++count) {
        const double v = want.dqkv[static_cast<std::size_t>(r * 3 * d + part * d + j)];
        ss += v * v;
      }
    const double rms = std::sqrt(ss / static_cast<double>(count));
    vec want_p, got_p, with_o_p, bound;
    for (index_t r = 0; r < rows; ++r)
      for (index_t j = 0; j < d; ++j) {
        const auto e = static_cast<std::size_t>(r * 3 * d + part * d + j);
        want_p.push_back(static_cast<float>(want.dqkv[e]));
        got_p.push_back(got[e]);
        with_o_p.push_back(with_o[e]);
        const double b = (t == dtype::f32 ? 1e-4 * rms * std::sqrt(static_cast<double>(c.steps)) / 4 : 0.0) +
                         8 * u * (std::fabs(want.dqkv[e]) + rms) + 1e-6;
        bound.push_back(static_cast<float>(b));
      }
    const char* which = part == 0 ? "dq" : part == 1 ? "dk" : "dv";
    check_within(got_p, want_p, bound, std::string("attention_bwd ") + which + " " + what);
    for (float& b : bound) b += static_cast<float>(2 * u * rms);
    check_within(with_o_p, want_p, bound, std::string("attention_bwd (with O) ") + which + " " + what);
  }
}

}  // namespace

TEST_CASE(TEST_BACKEND_NAME ": causal attention within the dtype's bound of double, both head dimensions, odd "
          "lengths",
          "[ops][attention]") {
  const std::vector<attention_case> cases = {
      {2, 77, 2, 64},   // S not a multiple of any tile
      {1, 5, 3, 64},    // shorter than one tile
      {2, 130, 2, 128}, // crosses two 64-row tiles with a ragged end
      {1, 64, 1, 128},  // exactly one tile
  };
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16})
    for (const auto& c : cases) attention_against_exact(t, c);
}

#ifdef TEST_BACKEND_CPU

namespace {

void check_attention_gradient(index_t batch, index_t steps, int heads, std::size_t stride) {
  constexpr index_t head_dim = 3;
  const index_t d = heads * head_dim;
  auto qkv = random_vector(batch * steps * 3 * d, 5);
  const auto dout = random_vector(batch * steps * d, 6);
  std::vector<double> att(batch * steps * d), lse(batch * steps * heads);
  std::vector<double> scratch(static_cast<std::size_t>(cpu::attention_scratch(steps, head_dim, false, cpu::threads())));
  auto loss = [&] {
    cpu::attention_fwd<head_dim>(att.data(), lse.data(), qkv.data(), batch, steps, heads, scratch.data(),
                                 index_t(scratch.size()));
    return dot(att, dout);
  };
  loss();
  std::vector<double> dqkv(qkv.size());
  cpu::attention_bwd<head_dim>(dqkv.data(), dout.data(), att.data(), qkv.data(), lse.data(), batch, steps, heads,
                               scratch.data(), index_t(scratch.size()));
  check_gradient(qkv, dqkv, loss, "dqkv", stride);
}

}  // namespace

TEST_CASE("causal attention backward matches central differences", "[ops]") {
  // two row blocks of a short sequence's height
  check_attention_gradient(2, cpu::attention_rows(64) + 9, 2, 5);
}

TEST_CASE("causal attention in a long sequence's taller blocks matches central differences", "[ops]") {
  const index_t steps = 600;  // above 512: blocks of 128 rows, the last one partial
  REQUIRE(cpu::attention_rows(steps) == 128);
  REQUIRE(cpu::attention_rows(cpu::attention_rows(64) + 9) == 64);
  check_attention_gradient(1, steps, 1, 97);
}

TEST_CASE("causal attention forward equals a naive softmax over the past", "[ops]") {
  constexpr index_t head_dim = 2;
  const index_t steps = 4;
  const int heads = 1;
  const auto qkv = random_vector(steps * 3 * head_dim, 7);
  std::vector<double> att(steps * head_dim), lse(steps);
  std::vector<double> scratch(static_cast<std::size_t>(cpu::attention_scratch(steps, head_dim, false, cpu::threads())));
  cpu::attention_fwd<head_dim>(att.data(), lse.data(), qkv.data(), 1, steps, heads, scratch.data(), index_t(scratch.size()));
  auto q = [&](index_t i, index_t j) { return qkv[static_cast<std::size_t>(i * 3 * head_dim + j)]; };
  auto k = [&](index_t i, index_t j) { return qkv[static_cast<std::size_t>(i * 3 * head_dim + head_dim + j)]; };
  auto v = [&](index_t i, index_t j) { return qkv[static_cast<std::size_t>(i * 3 * head_dim + 2 * head_dim + j)]; };
  for (index_t i = 0; i < steps; ++i) {
    std::vector<double> w(static_cast<std::size_t>(i + 1));
    double z = 0;
    for (index_t j = 0; j <= i; ++j) {
      double s = 0;
      for (index_t c = 0; c < head_dim; ++c) s += q(i, c) * k(j, c);
      w[static_cast<std::size_t>(j)] = std::exp(s / std::sqrt(double(head_dim)));
      z += w[static_cast<std::size_t>(j)];
    }
    CHECK(lse[static_cast<std::size_t>(i)] == Approx(std::log(z)).epsilon(1e-12));
    for (index_t c = 0; c < head_dim; ++c) {
      double o = 0;
      for (index_t j = 0; j <= i; ++j) o += w[static_cast<std::size_t>(j)] / z * v(j, c);
      CHECK(att[static_cast<std::size_t>(i * head_dim + c)] == Approx(o).epsilon(1e-12));
    }
  }
}

TEST_CASE("bf16 attention stays within the rounding of its probabilities and dS", "[ops]") {
  INFO(cpu::bf16_products());
  const auto shorter = check_bf16_attention(2, cpu::attention_rows(64) + 9, 2);
  const auto longer = check_bf16_attention(1, 600, 1);  // blocks of 128 rows widened, of dot_rows on the dot path
  if (attention_dots()) {
    // the widened path, as on a CPU without the instructions, within its tighter bound; the two
    // paths differ (the dot products' rounded probabilities show in the output)
    etude::test::bf16_path_scope widened(etude::test::bf16_path::widened);
    const auto shorter_widened = check_bf16_attention(2, cpu::attention_rows(64) + 9, 2);
    const auto longer_widened = check_bf16_attention(1, 600, 1);
    CHECK(!same_bits(shorter, shorter_widened));
    CHECK(!same_bits(longer, longer_widened));
  }
}

#ifdef ETUDE_CPU_X86_KERNELS
namespace {
// vmath512's exponential on 16 copies of x (the test programs are built for any x86-64).
ETUDE_CPU_AVX512_TARGET float exp16(float x) {
  float out[16];
  _mm512_storeu_ps(out, etude::backend::cpu_detail::vmath512::exp16(_mm512_set1_ps(x)));
  return out[0];
}
}  // namespace
#endif

// The score rows' loops (AVX-512 kernels where the CPU has them, the portable loops elsewhere):
// the exponential against libm, and a forward and backward row of every length against double,
// with exact +0 past the last key.
namespace {

// Float attention (its own kernels where this CPU has them, or oneDNN's products) against the
// double path on the same values: every output, log-sum-exp and gradient within 2^-16 of the
// largest of its kind (float's roundings are near 2^-24 of the terms; a wrong mask or a lost
// block moves values by their own size). Returns the float results, output then gradients.
template <int HeadDim>
std::vector<float> check_float_attention(index_t batch, index_t steps, int heads, bool own) {
  cpu::set_own_float_attention(own);
  CHECK(cpu::own_float_attention() == (own && etude::backend::cpu_detail::tile_product::available()));
  const index_t d = heads * HeadDim;
  const auto qkv = random_vector(batch * steps * 3 * d, 31, 2.0), dout = random_vector(batch * steps * d, 32);
  std::vector<double> att(batch * steps * d), lse(batch * steps * heads), dqkv(qkv.size());
  std::vector<double> sd(static_cast<std::size_t>(cpu::attention_scratch(steps, HeadDim, false, cpu::threads())));
  cpu::attention_fwd<HeadDim>(att.data(), lse.data(), qkv.data(), batch, steps, heads, sd.data(), index_t(sd.size()));
  cpu::attention_bwd<HeadDim>(dqkv.data(), dout.data(), att.data(), qkv.data(), lse.data(), batch, steps, heads,
                              sd.data(), index_t(sd.size()));
  const std::vector<float> qkv_f(qkv.begin(), qkv.end()), dout_f(dout.begin(), dout.end());
  std::vector<float> att_f(att.size()), lse_f(lse.size()), dqkv_f(qkv.size(), 7.0f);
  std::vector<float> sf(static_cast<std::size_t>(cpu::attention_scratch(steps, HeadDim, false, cpu::threads())));
  cpu::attention_fwd<HeadDim>(att_f.data(), lse_f.data(), qkv_f.data(), batch, steps, heads, sf.data(),
                              index_t(sf.size()));
  cpu::attention_bwd<HeadDim>(dqkv_f.data(), dout_f.data(), att_f.data(), qkv_f.data(), lse_f.data(), batch, steps,
                              heads, sf.data(), index_t(sf.size()));
  cpu::set_own_float_attention(true);
  auto within = [](const std::vector<float>& got, const std::vector<double>& want, const char* what) {
    double largest = 0, worst = 0;
    for (const double w : want) largest = std::max(largest, std::abs(w));
    std::size_t at = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      if (const double e = std::abs(double(got[i]) - want[i]); e > worst) worst = e, at = i;
    INFO(what << ": worst " << worst << " at " << at << " (" << got[at] << " vs " << want[at] << "), largest "
              << largest);
    CHECK(worst <= 0x1p-16 * largest);
  };
  within(att_f, att, "output");
  within(lse_f, lse, "log-sum-exp");
  within(dqkv_f, dqkv, "dqkv");
  std::vector<float> out = att_f;
  out.insert(out.end(), dqkv_f.begin(), dqkv_f.end());
  return out;
}

}  // namespace

TEST_CASE("float attention on etude's kernels and on oneDNN's products is float roundings from double", "[ops]") {
  // one partial block, a diagonal at 64 with 9 rows past it, 600 rows (128-row blocks on oneDNN's
  // path, 64 on the kernels'), a head dimension that is not whole vectors of 16
  for (const bool own : {true, false}) {
    INFO((own ? "etude's kernels" : "oneDNN's products"));
    check_float_attention<64>(2, 7, 2, own);
    check_float_attention<64>(2, cpu::attention_rows(64) + 9, 2, own);
    check_float_attention<64>(1, 600, 1, own);
    check_float_attention<24>(2, 150, 3, own);
  }
  if (etude::backend::cpu_detail::tile_product::available()) {
    // the two paths differ in the order of their additions, not by more
    CHECK(check_float_attention<64>(1, 130, 2, true) != check_float_attention<64>(1, 130, 2, false));
  }
}

TEST_CASE("attention's score rows are within a few roundings of double, zero past their keys", "[ops]") {
  namespace rows = etude::backend::cpu_detail::score_rows;
  using etude::bf16;
#ifdef ETUDE_CPU_X86_KERNELS
  if (etude::backend::cpu_detail::vmath512::available()) {
    for (float x = -87.0f; x <= 88.0f; x += 0.001953125f) {
      const double ref = std::exp(static_cast<double>(x));
      INFO("x = " << x);
      REQUIRE(std::abs(exp16(x) - ref) <= 2.5 * std::abs(ref) * 5.96e-8);
    }
    CHECK(exp16(-INFINITY) == 0.0f);
    CHECK(exp16(-110.0f) == 0.0f);
    CHECK(exp16(-95.0f) == Approx(std::exp(-95.0)).epsilon(1e-3));  // subnormal results keep their magnitude
    CHECK(std::isinf(exp16(88.8f)));
    CHECK(std::isinf(exp16(0x1p21f)));  // its domain's end: no clamp above, the reduction still holds
    CHECK(exp16(0.0f) == 1.0f);
    CHECK(std::isnan(exp16(std::nanf(""))));
  }
#endif
  const auto bits_zero = [](float x) { return std::signbit(x) == false && x == 0.0f; };
  for (const index_t keys : {1, 2, 15, 16, 17, 31, 64, 100, 257}) {
    INFO("keys = " << keys);
    const index_t width = rows::padded(keys) + 18, room = width + 16;
    auto s = random_vector(keys, 11 + keys, 6.0), g = random_vector(keys, 12 + keys, 2.0);
    for (double& v : s) v = static_cast<float>(v);  // the values the float rows hold
    for (double& v : g) v = static_cast<float>(v);
    // double: the probabilities, the log-sum-exp, dS = P·(dP − Σ P·dP)
    double mx = s[0], sum = 0.0, dot = 0.0;
    for (const double v : s) mx = std::max(mx, v);
    for (const double v : s) sum += std::exp(v - mx);
    const double lse = mx + std::log(sum);
    for (index_t j = 0; j < keys; ++j) dot += std::exp(s[j] - lse) * g[j];
    // forward in float, unnormalised in place, and rounded to bf16 with the row as scratch
    std::vector<float> row(room, 7.0f), row2(room, 7.0f);
    std::vector<bf16> rb(room, bf16(7.0f));
    for (index_t j = 0; j < keys; ++j) row[j] = row2[j] = static_cast<float>(s[j]);
    float inv = 0.0f, inv2 = 0.0f;
    const float l1 = rows::softmax(row.data(), static_cast<bf16*>(nullptr), keys, width, inv);
    const float l2 = rows::softmax(row2.data(), rb.data(), keys, width, inv2);
    CHECK(std::abs(l1 - lse) <= 4e-7 * std::max(1.0, std::abs(lse)));
    CHECK(l2 == l1);
    CHECK(inv == Approx(1.0 / sum).epsilon(4e-7));
    CHECK(inv2 == inv);
    for (index_t j = 0; j < keys; ++j) {
      // the exponential's 2 roundings, and the argument s − max rounded to float
      const double e = std::exp(s[j] - mx);
      REQUIRE(std::abs(row[j] - e) <= (3.0 + std::abs(s[j] - mx)) * 5.96e-8 * e + 1e-38);
      REQUIRE(static_cast<float>(rb[j]) == static_cast<float>(bf16(row[j])));
    }
    for (index_t j = keys; j < width; ++j) {
      REQUIRE(bits_zero(row[j]));
      REQUIRE(rb[j].bits == 0);
    }
    CHECK(row[std::max(width, rows::padded(keys))] == 7.0f);  // nothing written past the row
    // backward: dS in float in place over dP, and rounded to bf16
    std::vector<float> pr(room, 7.0f), dp(room, 7.0f), pr2(room, 7.0f), dp2(room, 7.0f);
    std::vector<bf16> ds(room, bf16(7.0f));
    for (index_t j = 0; j < keys; ++j) {
      pr[j] = pr2[j] = static_cast<float>(s[j]);
      dp[j] = dp2[j] = static_cast<float>(g[j]);
    }
    rows::backward(pr.data(), dp.data(), dp.data(), keys, width, static_cast<float>(lse));
    rows::backward(pr2.data(), dp2.data(), ds.data(), keys, width, static_cast<float>(lse));
    double scale = 0.0;
    for (index_t j = 0; j < keys; ++j) scale += std::exp(s[j] - lse) * std::abs(g[j]);
    for (index_t j = 0; j < keys; ++j) {
      const double p = std::exp(s[j] - lse), want = p * (g[j] - dot);
      REQUIRE(std::abs(pr[j] - p) <= (3.0 + 2.0 * std::abs(s[j] - lse)) * 5.96e-8 * p + 1e-38);
      REQUIRE(std::abs(dp[j] - want) <= 16.0 * 5.96e-8 * (p * (std::abs(g[j]) + scale)) + 1e-38);
      REQUIRE(pr2[j] == pr[j]);
      REQUIRE(static_cast<float>(ds[j]) == static_cast<float>(bf16(dp[j])));
    }
    for (index_t j = keys; j < width; ++j) {
      REQUIRE(bits_zero(pr[j]));
      REQUIRE(bits_zero(dp[j]));
      REQUIRE(ds[j].bits == 0);
    }
  }
}

// The bf16 dot path rounds P and dS two vectors at a time (vcvtne2ps2bf16, which reads subnormal
// floats as zero, with round_to_bf16 for a pair holding one, or for none in a forward row whose
// scores rule them out) and pairs two rows' values in words for the transposed products: the same
// bits as the row-at-a-time kernels and bf16(float), with scores reaching e^-104 (subnormal
// probabilities), rows of any length and an odd last row.
TEST_CASE("bf16 score rows rounded and paired two at a time are bf16(float), subnormals included", "[ops]") {
#ifdef ETUDE_CPU_X86_KERNELS
  namespace rows = etude::backend::cpu_detail::score_rows;
  namespace pairs = etude::backend::cpu_detail::tile_product;
  using etude::bf16;
  if (!pairs::available()) {
    WARN("this CPU has no AVX512_BF16: the paired score rows are not exercised");
    return;
  }
  index_t subnormal = 0;
  for (const index_t keys : {1, 2, 16, 17, 32, 33, 63, 100, 257}) {
    INFO("keys = " << keys);
    const index_t cols = keys + 5, room = rows::padded(cols) + 32;
    // scores from lse − 110 to lse + 1: probabilities from 0 through subnormals to about 1
    const auto s0 = random_vector(room, 31 + keys, 1.0), s1 = random_vector(room, 32 + keys, 1.0);
    const auto g0 = random_vector(room, 33 + keys, 2.0), g1 = random_vector(room, 34 + keys, 2.0);
    const float lse0 = 3.0f, lse1 = -2.0f;
    std::vector<float> a(room, 0.0f), b(room, 0.0f), da(room, 0.0f), db(room, 0.0f);
    for (index_t j = 0; j < room; ++j) {
      a[j] = lse0 - 110.0f * static_cast<float>(std::abs(s0[j]));
      b[j] = lse1 + 1.0f - 111.0f * static_cast<float>(std::abs(s1[j]));
      da[j] = static_cast<float>(g0[j]);
      db[j] = static_cast<float>(g1[j]);
    }
    // the forward's rounded probabilities: paired against one vector at a time
    std::vector<bf16> one(room, bf16(7.0f)), two(room, bf16(7.0f));
    const float sum1 = rows::kernel::softmax<true>(a.data(), one.data(), keys, 1.0f);
    const float sum2 = rows::paired::softmax(a.data(), two.data(), keys, 1.0f);
    CHECK(sum1 == sum2);
    for (index_t j = 0; j < rows::padded(keys); ++j) REQUIRE(one[j].bits == two[j].bits);
    CHECK(two[rows::padded(keys)].bits == bf16(7.0f).bits);  // nothing written past the row's vectors
    // the forward's entry point rounds by vcvtne2ps2bf16 alone where no exponential can be
    // subnormal (every score within 87 of the row's largest) and tests each pair otherwise
    for (const float spread : {110.0f, 86.0f}) {
      INFO("scores down to " << spread << " below the largest");
      std::vector<float> r(room, 0.0f);
      for (index_t j = 0; j < room; ++j) r[j] = 0.5f - spread * static_cast<float>(std::abs(s0[j]));
      const float mx = *std::max_element(r.begin(), r.begin() + keys);
      std::vector<bf16> got(room, bf16(7.0f)), want(room, bf16(7.0f));
      float inv = 0.0f;
      rows::softmax(r.data(), got.data(), keys, cols, inv);
      rows::kernel::softmax<true>(r.data(), want.data(), keys, mx);
      for (index_t j = 0; j < rows::padded(keys); ++j) {
        subnormal += j < keys && r[j] - mx < -87.4f;
        REQUIRE(got[j].bits == want[j].bits);
      }
    }
    // the backward: two rows (and a row alone) against backward() row by row and joined words
    for (const bool both : {true, false}) {
      INFO("second row: " << both);
      std::vector<float> pa = a, pb = b, qa = a, qb = b;
      std::vector<bf16> sa(room, bf16(7.0f)), sb(room, bf16(7.0f)), ta(room, bf16(7.0f)), tb(room, bf16(7.0f));
      std::vector<pairs::word> pp(room, 0xFFFFFFFFu), sp(room, 0xFFFFFFFFu);
      const index_t keys_b = both ? std::max<index_t>(1, keys - 1) : 0;
      using row = rows::paired::backward_row;
      rows::paired::backward_pair(row{pa.data(), da.data(), sa.data(), keys, lse0},
                                  both ? row{pb.data(), db.data(), sb.data(), keys_b, lse1}
                                       : row{pa.data(), da.data(), nullptr, 0, 0.0f},
                                  pp.data(), sp.data(), cols);
      rows::kernel::backward(qa.data(), da.data(), ta.data(), keys, lse0);
      if (both) rows::kernel::backward(qb.data(), db.data(), tb.data(), keys_b, lse1);
      for (index_t j = 0; j < cols; ++j) {
        const float p0 = j < keys ? qa[j] : 0.0f, p1 = both && j < keys_b ? qb[j] : 0.0f;
        const bf16 d0 = j < keys ? ta[j] : bf16(0.0f), d1 = both && j < keys_b ? tb[j] : bf16(0.0f);
        subnormal += (p0 != 0.0f && std::abs(p0) < 0x1p-126f) + (p1 != 0.0f && std::abs(p1) < 0x1p-126f);
        REQUIRE(pp[j] == pairs::join(bf16(p0), bf16(p1)));
        REQUIRE(sp[j] == pairs::join(d0, d1));
        REQUIRE(sa[j].bits == d0.bits);
        if (both) REQUIRE(sb[j].bits == d1.bits);
      }
      CHECK(pp[cols] == 0xFFFFFFFFu);  // the next pair of rows' words are not written
      CHECK(sp[cols] == 0xFFFFFFFFu);
      if (!both) CHECK(sb[0].bits == bf16(7.0f).bits);
    }
  }
  CHECK(subnormal > 0);  // the pair rounding's fallback was needed
#else
  WARN("built without the AVX512_BF16 kernels: the paired score rows are not exercised");
#endif
}

// A head's float rows rounded into strided bf16 rows (narrow_head, on the kernels' two-vectors-at-
// a-time rounding where the CPU has AVX512_BF16), each times its row's scale where one is given:
// bf16(float)'s bits for every element, widths of whole pairs of vectors and with a tail, values
// down to subnormal products, and nothing written between the rows.
TEST_CASE("attention heads narrowed to bf16 are bf16(x·scale) element by element", "[ops]") {
  using etude::bf16;
  const index_t rows = 5, ld = 100;
  for (const index_t head_dim : {64, 40, 7}) {
    INFO("head_dim = " << head_dim);
    const auto v = random_vector(rows * head_dim, 41, 4.0);
    std::vector<float> src(v.size()), scale(rows);
    for (std::size_t i = 0; i < v.size(); ++i) src[i] = float(v[i]) * (i % 9 == 0 ? 0x1p-130f : 1.0f);
    for (index_t s = 0; s < rows; ++s) scale[std::size_t(s)] = 0.75f / float(s + 1);
    for (const bool scaled : {false, true}) {
      std::vector<bf16> dst(std::size_t(rows * ld), bf16(7.0f));
      etude::backend::cpu_detail::narrow_head(dst.data(), ld, src.data(), rows, head_dim,
                                              scaled ? scale.data() : nullptr);
      for (index_t s = 0; s < rows; ++s) {
        for (index_t j = 0; j < head_dim; ++j) {
          const float x = src[std::size_t(s * head_dim + j)] * (scaled ? scale[std::size_t(s)] : 1.0f);
          REQUIRE(dst[std::size_t(s * ld + j)].bits == bf16(x).bits);
        }
        for (index_t j = head_dim; j < ld; ++j) REQUIRE(dst[std::size_t(s * ld + j)].bits == bf16(7.0f).bits);
      }
    }
  }
}

#endif  // TEST_BACKEND_CPU
