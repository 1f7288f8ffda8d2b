// The CUDA op set against the CPU backend (the oracle), op by op, on the same inputs: every op,
// float and bf16 (fp16 where the op supports it), head dimensions 64 and 128, sizes that are not
// multiples of the tiles, and determinism (two runs bit-identical). Inputs are drawn in float and
// rounded to the storage dtype first, so both backends see identical values; the CPU runs in float
// on them. Bounds come from the dtype:
//   - u = unit roundoff (dtype_traits): 2^-24 (float), 2^-8 (bf16: 8 significant bits), 2^-11 (fp16).
//   - A value computed in float from identical inputs and rounded once to the storage type is
//     within u·|y| of the float result, plus the float computation's own error; so 16-bit results
//     are compared with the CPU's unrounded float result at u·|y| + (float error).
//   - Float computations that only reorder sums differ by at most 2·n·2^-24·Σ|terms| (the γ_n bound
//     of each order), n the number of terms; transcendental functions add a few ulp (1e-6 relative).
// Each check names its bound where it is used. The ops already written once for every backend
// (tests/ops/<op>.cpp: layernorm against the fp64 oracle; softmax_xent, embedding, elementwise,
// reduce, adamw, sgd and step_control against the CPU in float) are compiled into the same programs
// in CUDA's category (tests/ops/category_cuda.hpp); what stays here is the rest (gemm, attention),
// and CUDA's own questions (a layernorm dim that is no multiple of the vector width, the device
// query).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "etude/backend/cpu/cpu.hpp"
#include "etude/core/dtype.hpp"
#include "../ops/oracle.hpp"
#include "host_util.hpp"
#include "ops_device.hpp"

namespace {

using etude::index_t;
using etude::gpu_test::dtype;
using etude::gpu_test::tokens;
using etude::gpu_test::vec;
using cpu = etude::backend::cpu;
namespace dev = etude::gpu_test;

using etude::gpu_test::name;
using etude::gpu_test::unit_roundoff;
using etude::gpu_test::with_cpu_head_dim;
using etude::test::ops::bit_identical;
using etude::test::ops::check_close;
using etude::test::ops::check_equal;
using etude::test::ops::check_within;
using etude::test::ops::round_to;
using etude::test::ops::uniform;

vec abs_of(vec x) {
  for (float& v : x) v = std::fabs(v);
  return x;
}

// Row-major op(A) element counts.
index_t rows_of(bool t, index_t r, index_t c) { return t ? c : r; }

}  // namespace

TEST_CASE("gpu device present", "[gpu]") {
  INFO("device: " << dev::device_name());
  REQUIRE(dev::device_count() > 0);
}

TEST_CASE("gemm matches the CPU for every transpose, dtype and output type", "[gpu][gemm]") {
  // m, n, k not multiples of any tile; leading dimensions past the rows, rounded up to 8 elements
  // (16 bytes of 16-bit values: what cuBLASLt's tensor-core algorithms need, as the model's shapes give)
  const index_t m = 37, n = 45, k = 29;
  auto ld = [](index_t v) { return (v + 1 + 7) / 8 * 8; };
  for (dtype ab : {dtype::f32, dtype::bf16, dtype::f16})
    for (dtype c : {ab, dtype::f32}) {
      if (ab == dtype::f32 && c != ab) continue;
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const index_t lda = ld(rows_of(ta, k, m)), ldb = ld(rows_of(tb, n, k)), ldc = ld(n);
          const index_t a_rows = ta ? k : m, b_rows = tb ? n : k;
          const vec a = uniform(static_cast<std::size_t>(a_rows * lda), -1, 1, 1, ab);
          const vec b = uniform(static_cast<std::size_t>(b_rows * ldb), -1, 1, 2, ab);
          const vec c0 = uniform(static_cast<std::size_t>(m * ldc), -1, 1, 3, c);
          const float alpha = 0.75f, beta = c == dtype::f32 && ab != dtype::f32 ? 1.0f : 0.5f;
          vec want = c0, absprod(c0.size(), 0.0f);
          cpu::gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, want.data(), ldc);
          const vec aa = abs_of(a), ab_ = abs_of(b);
          cpu::gemm(ta, tb, m, n, k, 1.0, aa.data(), lda, ab_.data(), ldb, 0.0, absprod.data(), ldc);
          vec got = c0;
          const std::size_t plans = dev::gemm(ab, c, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, got, ldc, false, 2);
          CHECK(plans == 1);  // the second identical call reuses the cached plan
          // fp32 accumulation in both, any order: 2·k·2^-24·Σ|αab| (+ |βc| once); then one rounding
          // to C's dtype: u_C·|result|.
          vec bound(want.size());
          for (std::size_t i = 0; i < want.size(); ++i)
            bound[i] = static_cast<float>(2.0 * (k + 2) * 0x1p-24 * (alpha * absprod[i] + std::fabs(beta * c0[i])) +
                                          unit_roundoff(c) * std::fabs(want[i]) + 1e-30);
          check_within(got, want, bound,
                       std::string("gemm ") + name(ab) + "->" + name(c) + (ta ? " T" : " N") + (tb ? "T" : "N"));
        }
    }
}

TEST_CASE("gemm with TF32 stays within the TF32 bound; the default is exact fp32", "[gpu][gemm]") {
  const index_t m = 64, n = 48, k = 96;
  const vec a = uniform(static_cast<std::size_t>(m * k), -1, 1, 4), b = uniform(static_cast<std::size_t>(k * n), -1, 1, 5);
  vec want(static_cast<std::size_t>(m * n), 0.0f), absprod = want;
  cpu::gemm(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.0, want.data(), n);
  const vec aa = abs_of(a), bb = abs_of(b);
  cpu::gemm(false, false, m, n, k, 1.0, aa.data(), k, bb.data(), n, 0.0, absprod.data(), n);
  vec got(want.size(), 0.0f);
  dev::gemm(dtype::f32, dtype::f32, false, false, m, n, k, 1.0f, a, k, b, n, 0.0f, got, n, true);
  // TF32 keeps 10 fraction bits: each input rounds by 2^-11, each product by up to 2·2^-11.
  vec bound(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) bound[i] = static_cast<float>((0x1p-10 + 2.0 * k * 0x1p-24) * absprod[i]);
  check_within(got, want, bound, "gemm tf32");
}

TEST_CASE("gemm_gelu writes the product and its exact-erf GELU", "[gpu][gemm]") {
  const index_t m = 33, n = 40, k = 24;
  for (dtype t : {dtype::f32, dtype::bf16}) {
    const vec a = uniform(static_cast<std::size_t>(m * k), -1, 1, 6, t), b = uniform(static_cast<std::size_t>(n * k), -1, 1, 7, t);
    vec pre(static_cast<std::size_t>(m * n), 0.0f), act = pre, want = pre, absprod = pre;
    cpu::gemm(false, true, m, n, k, 1.0, a.data(), k, b.data(), k, 0.0, want.data(), n);
    const vec aa = abs_of(a), bb = abs_of(b);
    cpu::gemm(false, true, m, n, k, 1.0, aa.data(), k, bb.data(), k, 0.0, absprod.data(), n);
    dev::gemm_gelu(t, false, true, m, n, k, a, k, b, k, pre, act, n);
    vec bound(want.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      bound[i] = static_cast<float>(2.0 * k * 0x1p-24 * absprod[i] + unit_roundoff(t) * std::fabs(want[i]));
    check_within(pre, want, bound, std::string("gemm_gelu pre ") + name(t));
    // act from the device's own pre: float GELU within a few ulp, one rounding
    vec want_act(pre.size());
    cpu::gelu_fwd(want_act.data(), pre.data(), static_cast<index_t>(pre.size()));
    check_close(act, want_act, unit_roundoff(t) + 1e-6, 1e-7, std::string("gemm_gelu act ") + name(t));
  }
}

TEST_CASE("layernorm refuses a dim that is no multiple of the vector width", "[gpu][layernorm]") {
  const vec x(3 * 20, 1.0f), g(20, 1.0f), b(20, 0.0f);
  CHECK_THROWS_AS(dev::layernorm_fwd(dtype::f32, x, {}, g, b, 3, 20), etude::error);
}

namespace {

struct attention_case {
  index_t batch, steps;
  int heads;
  index_t head_dim;
};

void attention_against_cpu(dtype t, const attention_case& c) {
  const index_t d = c.heads * c.head_dim, rows = c.batch * c.steps;
  const double u = unit_roundoff(t);
  const std::string what = std::string(name(t)) + " hd " + std::to_string(c.head_dim) + " S " + std::to_string(c.steps) +
                           " B " + std::to_string(c.batch) + " H " + std::to_string(c.heads);
  const vec qkv = uniform(static_cast<std::size_t>(rows * 3 * d), -1, 1, 60, t);
  vec att(static_cast<std::size_t>(rows * d)), lse(static_cast<std::size_t>(rows * c.heads));
  vec scratch(static_cast<std::size_t>(cpu::attention_scratch(c.steps, c.head_dim, false, cpu::threads())));
  with_cpu_head_dim(c.head_dim, [&](auto hd) {
    cpu::attention_fwd<decltype(hd)::value>(att.data(), lse.data(), qkv.data(), c.batch, c.steps, c.heads,
                                            scratch.data(), static_cast<index_t>(scratch.size()));
  });
  const auto out = dev::attention_fwd(t, qkv, c.batch, c.steps, c.heads, c.head_dim);
  // fp32: scores differ by <= hd·2^-24·Σ|q k|·scale (<= 2e-5 here), which moves p relatively and
  // O = Σ p v (|v| <= 1) by as much. 16-bit: p is rounded to the storage type before P·V (<= u·max|v|)
  // and O once more on store (u·|O|).
  const double fp32 = 3e-5;
  check_close(out.att, att, u, fp32 + (t == dtype::f32 ? 0.0 : u), "attention_fwd att " + what);
  check_close(out.lse, lse, 1e-6, fp32, "attention_fwd lse " + what);

  const vec datt = uniform(att.size(), -1, 1, 61, t);
  vec dqkv(qkv.size());
  with_cpu_head_dim(c.head_dim, [&](auto hd) {
    cpu::attention_bwd<decltype(hd)::value>(dqkv.data(), datt.data(), att.data(), qkv.data(), lse.data(), c.batch,
                                            c.steps, c.heads, scratch.data(), static_cast<index_t>(scratch.size()));
  });
  const vec got = dev::attention_bwd(t, datt, qkv, out.lse, {}, c.batch, c.steps, c.heads, c.head_dim);
  const vec with_o = dev::attention_bwd(t, datt, qkv, out.lse, out.att, c.batch, c.steps, c.heads, c.head_dim);
  const vec again = dev::attention_bwd(t, datt, qkv, out.lse, {}, c.batch, c.steps, c.heads, c.head_dim);
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
        const float v = dqkv[static_cast<std::size_t>(r * 3 * d + part * d + j)];
        ss += static_cast<double>(v) * v;
      }
    const double rms = std::sqrt(ss / static_cast<double>(count));
    vec want_p, got_p, with_o_p, bound;
    for (index_t r = 0; r < rows; ++r)
      for (index_t j = 0; j < d; ++j) {
        const auto e = static_cast<std::size_t>(r * 3 * d + part * d + j);
        want_p.push_back(dqkv[e]);
        got_p.push_back(got[e]);
        with_o_p.push_back(with_o[e]);
        const double b = (t == dtype::f32 ? 1e-4 * rms * std::sqrt(static_cast<double>(c.steps)) / 4 : 0.0) +
                         8 * u * (std::fabs(dqkv[e]) + rms) + 1e-6;
        bound.push_back(static_cast<float>(b));
      }
    const char* which = part == 0 ? "dq" : part == 1 ? "dk" : "dv";
    check_within(got_p, want_p, bound, std::string("attention_bwd ") + which + " " + what);
    for (float& b : bound) b += static_cast<float>(2 * u * rms);
    check_within(with_o_p, want_p, bound, std::string("attention_bwd (with O) ") + which + " " + what);
  }
}

}  // namespace

TEST_CASE("flash attention matches the CPU for both head dimensions and odd lengths", "[gpu][attention]") {
  const std::vector<attention_case> cases = {
      {2, 77, 2, 64},   // S not a multiple of any tile
      {1, 5, 3, 64},    // shorter than one tile
      {2, 130, 2, 128}, // crosses two 64-row tiles with a ragged end
      {1, 64, 1, 128},  // exactly one tile
  };
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16})
    for (const auto& c : cases) attention_against_cpu(t, c);
}

TEST_CASE("attention refuses unsupported head dimensions", "[gpu][attention]") {
  const vec qkv(static_cast<std::size_t>(2 * 3 * 96), 0.0f);
  CHECK_THROWS_AS(dev::attention_fwd(dtype::f32, qkv, 1, 2, 1, 96), etude::error);
}
