// bf16 self-attention against the double path on the same values, within the bounds of the
// roundings the path makes (shared by tests/ops/attention.cpp and the AMX tests, tests/ops/amx.cpp).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>

#include "ops/oracle.hpp"

namespace etude::test::ops {

using cpu = etude::backend::cpu;

// Self-attention's dot path: bf16 products on the instructions (AMX tiles or vdpbf16ps) and etude's
// kernels.
inline bool attention_dots() { return cpu::bf16_dot_products() && etude::backend::cpu_detail::tile_product::available(); }

// bf16 q, k, v and dO (cpu_gemm's bf16 dot products where this CPU has them, else widened to
// float) against the double path on the same values. With dot products P and dS are rounded to
// bf16 (relative error ≤ u each) before they meet V, dO, Q and K; the output is rounded once more.
// Float's own errors (scores, exp, sums over ≤ 600 terms) stay below 2^-12 of the terms' size.
// Without dot products (widened) nothing but the output is rounded: the bound drops P's and dS's u.
// Returns the bf16 output.
inline std::vector<etude::bf16> check_bf16_attention(index_t batch, index_t steps, int heads) {
  using etude::bf16;
  constexpr index_t hd = 64;
  const index_t d = heads * hd, ld = 3 * d;
  const double u = etude::dtype_traits<bf16>::unit_roundoff, f = 0x1p-12, scale = 1 / std::sqrt(double(hd));
  const double pu = attention_dots() ? u : 0.0;  // the rounding of P and dS
  const auto qkv = rounded(random_vector(batch * steps * ld, 11, 2.0)), dout = rounded(random_vector(batch * steps * d, 12));
  const auto qkv_b = narrow(qkv), dout_b = narrow(dout);

  std::vector<double> att(batch * steps * d), lse(batch * steps * heads), dqkv(qkv.size());
  std::vector<double> sd(static_cast<std::size_t>(cpu::attention_scratch(steps, hd, false, cpu::threads())));
  cpu::attention_fwd<hd>(att.data(), lse.data(), qkv.data(), batch, steps, heads, sd.data(), index_t(sd.size()));
  cpu::attention_bwd<hd>(dqkv.data(), dout.data(), att.data(), qkv.data(), lse.data(), batch, steps, heads, sd.data(),
                         index_t(sd.size()));

  std::vector<bf16> att_b(att.size());
  std::vector<float> lse_f(lse.size()), dqkv_f(qkv.size());
  std::vector<float> sf(static_cast<std::size_t>(cpu::attention_scratch(steps, hd, true, cpu::threads())));
  cpu::attention_fwd<hd>(att_b.data(), lse_f.data(), qkv_b.data(), batch, steps, heads, sf.data(), index_t(sf.size()));
  cpu::attention_bwd<hd>(dqkv_f.data(), dout_b.data(), att_b.data(), qkv_b.data(), lse_f.data(), batch, steps, heads,
                         sf.data(), index_t(sf.size()));

  double worst = 0;  // largest error as a fraction of its bound
  auto within = [&](double got, double want, double bound, const char* what, index_t row, index_t col) {
    worst = std::max(worst, std::abs(got - want) / bound);
    if (std::abs(got - want) > bound) {
      INFO(what << " row " << row << " column " << col << ": " << got << " vs " << want << ", bound " << bound);
      CHECK(std::abs(got - want) <= bound);
    }
  };
  std::vector<double> pr(static_cast<std::size_t>(steps * steps)), ds(pr.size()), dp(pr.size()), dsum(steps);
  for (index_t b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h) {
      auto at = [&](const std::vector<double>& t, index_t row, index_t part, index_t c) {
        return t[static_cast<std::size_t>((b * steps + row) * ld + part * d + h * hd + c)];
      };
      auto o_at = [&](const std::vector<double>& t, index_t row, index_t c) {
        return t[static_cast<std::size_t>((b * steps + row) * d + h * hd + c)];
      };
      for (index_t i = 0; i < steps; ++i) {
        const double l = lse[static_cast<std::size_t>((b * steps + i) * heads + h)];
        CHECK(std::abs(lse_f[static_cast<std::size_t>((b * steps + i) * heads + h)] - l) <= f * (1 + std::abs(l)));
        double D = 0;
        for (index_t j = 0; j <= i; ++j) {
          double s = 0, g = 0;
          for (index_t c = 0; c < hd; ++c) {
            s += at(qkv, i, 0, c) * at(qkv, j, 1, c);
            g += o_at(dout, i, c) * at(qkv, j, 2, c);
          }
          pr[i * steps + j] = std::exp(scale * s - l);
          dp[i * steps + j] = g;
          D += pr[i * steps + j] * g;
        }
        dsum[i] = D;
        for (index_t j = 0; j <= i; ++j) ds[i * steps + j] = pr[i * steps + j] * (dp[i * steps + j] - D);
        for (index_t c = 0; c < hd; ++c) {
          double pv = 0;
          for (index_t j = 0; j <= i; ++j) pv += pr[i * steps + j] * std::abs(at(qkv, j, 2, c));
          const double o = o_at(att, i, c);
          within(static_cast<float>(att_b[static_cast<std::size_t>((b * steps + i) * d + h * hd + c)]), o,
                 u * std::abs(o) + (pu + f) * pv, "att", i, c);
        }
      }
      // dS's float error: P·(|dP| + |Σ P·dP|) times float's 2^-12
      auto ds_bound = [&](index_t i, index_t j) {
        const double p = pr[i * steps + j];
        return pu * std::abs(ds[i * steps + j]) + f * p * (std::abs(dp[i * steps + j]) + std::abs(dsum[i]));
      };
      for (index_t r = 0; r < steps; ++r)
        for (index_t c = 0; c < hd; ++c) {
          double bq = 0, bk = 0, bv = 0;
          for (index_t j = 0; j <= r; ++j) bq += ds_bound(r, j) * std::abs(at(qkv, j, 1, c));
          for (index_t i = r; i < steps; ++i) {
            bk += ds_bound(i, r) * std::abs(at(qkv, i, 0, c));
            bv += (pu + f) * pr[i * steps + r] * std::abs(o_at(dout, i, c));
          }
          const auto got = [&](index_t part) {
            return double(dqkv_f[static_cast<std::size_t>((b * steps + r) * ld + part * d + h * hd + c)]);
          };
          within(got(0), at(dqkv, r, 0, c), scale * bq + 1e-30, "dq", r, c);
          within(got(1), at(dqkv, r, 1, c), scale * bk + 1e-30, "dk", r, c);
          within(got(2), at(dqkv, r, 2, c), bv + 1e-30, "dv", r, c);
        }
    }
  std::printf("bf16 attention (%s), S=%ld: largest error %.2f of its bound\n",
              attention_dots() ? "bf16 dot products" : "widened to float", static_cast<long>(steps), worst);
  return att_b;
}

}  // namespace etude::test::ops
