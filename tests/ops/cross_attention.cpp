// Cross-attention (ops/cross_attention.hpp) on the CPU: the forward against a plain softmax over the
// valid condition positions in double (with the padding mask, without it, and an example with no
// valid position: att 0, lse +inf), the backward against central differences of the forward, and
// the float path within a few ulp of the double one; bf16 q, kv and dO against the double path within
// the rounding of the probabilities and dS, on both bf16 paths where the CPU has the dot products. Queries are read with a row stride past their
// width, as the model's fused projections give them. The device's op against the CPU's is
// tests/gpu/step_cond.cpp's; the conditioned model's gradients tests/config/conditions.cpp's.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>

#include "ops/oracle.hpp"
#include "product_paths.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

namespace {

constexpr int heads = 2, hd = 4;
constexpr index_t dim = heads * hd, ldq = dim + 3;
constexpr index_t batch = 3, steps = 5, positions = 4;

struct reference_out {
  std::vector<double> att, lse;
};

reference_out reference(const std::vector<double>& q, const std::vector<double>& kv, const double* mask) {
  reference_out r{std::vector<double>(static_cast<std::size_t>(batch * steps * dim)),
                  std::vector<double>(static_cast<std::size_t>(batch * steps * heads))};
  for (index_t b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (index_t s = 0; s < steps; ++s) {
        std::vector<double> p(static_cast<std::size_t>(positions), 0.0);
        double mx = -INFINITY;
        for (index_t j = 0; j < positions; ++j) {
          if (mask != nullptr && mask[b * positions + j] == 0) continue;
          double d = 0;
          for (index_t c = 0; c < hd; ++c)
            d += q[static_cast<std::size_t>((b * steps + s) * ldq + h * hd + c)] *
                 kv[static_cast<std::size_t>((b * positions + j) * 2 * dim + h * hd + c)];
          p[static_cast<std::size_t>(j)] = d / std::sqrt(double(hd));
          mx = std::max(mx, p[static_cast<std::size_t>(j)]);
        }
        double sum = 0;
        for (index_t j = 0; j < positions; ++j) {
          if (mask != nullptr && mask[b * positions + j] == 0) continue;
          sum += (p[static_cast<std::size_t>(j)] = std::exp(p[static_cast<std::size_t>(j)] - mx));
        }
        r.lse[static_cast<std::size_t>((b * steps + s) * heads + h)] =
            sum > 0 ? mx + std::log(sum) : std::numeric_limits<double>::infinity();
        for (index_t c = 0; c < hd; ++c) {
          double a = 0;
          if (sum > 0)
            for (index_t j = 0; j < positions; ++j)
              a += p[static_cast<std::size_t>(j)] / sum *
                   kv[static_cast<std::size_t>((b * positions + j) * 2 * dim + dim + h * hd + c)];
          r.att[static_cast<std::size_t>((b * steps + s) * dim + h * hd + c)] = a;
        }
      }
  return r;
}

template <class T>
struct run_out {
  std::vector<T> att;
  std::vector<T> lse;
};

// the CPU's forward in T (T's compute type is T for double and float)
template <class T>
run_out<T> forward(const std::vector<T>& q, const std::vector<T>& kv, const T* mask) {
  run_out<T> r{std::vector<T>(static_cast<std::size_t>(batch * steps * dim)),
               std::vector<T>(static_cast<std::size_t>(batch * steps * heads))};
  const index_t size = cpu::cross_attention_scratch(steps, positions, hd, false, omp_get_max_threads());
  std::vector<T> scratch(static_cast<std::size_t>(size));
  cpu::cross_attention_fwd<hd>(r.att.data(), r.lse.data(), q.data(), kv.data(), mask, batch, steps, positions, heads,
                               ldq, scratch.data(), size);
  return r;
}

}  // namespace

TEST_CASE("cross_attention_fwd is the softmax over the valid condition positions", "[ops][cross_attention]") {
  const auto q = random_vector(static_cast<std::size_t>(batch * steps * ldq), 1, 2.0);
  const auto kv = random_vector(static_cast<std::size_t>(batch * positions * 2 * dim), 2, 2.0);
  // example 1 padded after two positions, example 2 with no valid position at all
  const std::vector<double> mask{1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0};
  for (const double* m : {mask.data(), static_cast<const double*>(nullptr)}) {
    INFO((m != nullptr ? "masked" : "unmasked"));
    const auto want = reference(q, kv, m);
    const auto got = forward(q, kv, m);
    for (std::size_t i = 0; i < want.att.size(); ++i)
      CHECK(got.att[i] == Approx(want.att[i]).epsilon(1e-12).margin(1e-14));
    for (std::size_t i = 0; i < want.lse.size(); ++i) {
      if (std::isinf(want.lse[i])) CHECK(got.lse[i] == want.lse[i]);
      else CHECK(got.lse[i] == Approx(want.lse[i]).epsilon(1e-12));
    }
    // float: within a few ulp of the double result on the same values
    const std::vector<float> qf(q.begin(), q.end()), kvf(kv.begin(), kv.end());
    const std::vector<float> mf(mask.begin(), mask.end());
    const auto gotf = forward(qf, kvf, m != nullptr ? mf.data() : nullptr);
    check_close(gotf.att, as_float(want.att), 1e-5, 1e-6, "cross_attention_fwd att in float");
  }
}

TEST_CASE("cross_attention_bwd matches central differences of the forward", "[ops][cross_attention]") {
  auto q = random_vector(static_cast<std::size_t>(batch * steps * ldq), 3);
  auto kv = random_vector(static_cast<std::size_t>(batch * positions * 2 * dim), 4);
  const auto datt = random_vector(static_cast<std::size_t>(batch * steps * dim), 5);
  const std::vector<double> mask{1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 1, 0};
  for (const double* m : {mask.data(), static_cast<const double*>(nullptr)}) {
    INFO((m != nullptr ? "masked" : "unmasked"));
    const auto fwd = forward(q, kv, m);
    std::vector<double> dq(q.size(), 0.0), dkv(kv.size(), 0.0);
    const index_t size = cpu::cross_attention_scratch(steps, positions, hd, false, omp_get_max_threads());
    std::vector<double> scratch(static_cast<std::size_t>(size));
    cpu::cross_attention_bwd<hd>(dq.data(), dkv.data(), datt.data(), q.data(), kv.data(), fwd.lse.data(), m, batch,
                                 steps, positions, heads, ldq, scratch.data(), size);
    auto loss = [&] { return dot(forward(q, kv, m).att, datt); };
    check_gradient(q, dq, loss, "dq");
    check_gradient(kv, dkv, loss, "dkv");
  }
}

namespace {

// Cross-attention with bf16 q, kv and dO against the double path on the same values, the bounds
// of check_bf16_attention: P (normalised) and dS rounded to bf16 where they meet the dot products,
// float's own errors below 2^-12 of the terms' size. Example 0 attends to every condition position,
// example 1 to the first `positions - 7`, example 2 to none (its output and gradients are 0).
// Returns the bf16 output.
std::vector<etude::bf16> check_bf16_cross_attention(index_t steps, index_t positions, int heads) {
  using etude::bf16;
  constexpr index_t hd = 64;
  const index_t batch = 3, d = heads * hd;
  const double u = etude::dtype_traits<bf16>::unit_roundoff, f = 0x1p-12, scale = 1 / std::sqrt(double(hd));
  const double pu = cpu::bf16_dot_products() ? u : 0.0;
  const auto q = rounded(random_vector(batch * steps * d, 21, 2.0)), kv = rounded(random_vector(batch * positions * 2 * d, 22, 2.0));
  const auto dout = rounded(random_vector(batch * steps * d, 23));
  std::vector<double> mask(static_cast<std::size_t>(batch * positions), 1.0);
  for (index_t j = positions - 7; j < positions; ++j) mask[static_cast<std::size_t>(positions + j)] = 0.0;
  for (index_t j = 0; j < positions; ++j) mask[static_cast<std::size_t>(2 * positions + j)] = 0.0;
  const std::vector<float> mask_f(mask.begin(), mask.end());

  std::vector<double> att(batch * steps * d), lse(batch * steps * heads), dq(q.size()), dkv(kv.size());
  std::vector<double> sd(
      static_cast<std::size_t>(cpu::cross_attention_scratch(steps, positions, hd, false, cpu::threads())));
  cpu::cross_attention_fwd<hd>(att.data(), lse.data(), q.data(), kv.data(), mask.data(), batch, steps, positions,
                               heads, d, sd.data(), index_t(sd.size()));
  cpu::cross_attention_bwd<hd>(dq.data(), dkv.data(), dout.data(), q.data(), kv.data(), lse.data(), mask.data(), batch,
                               steps, positions, heads, d, sd.data(), index_t(sd.size()));

  const auto q_b = narrow(q), kv_b = narrow(kv), dout_b = narrow(dout);
  std::vector<bf16> att_b(att.size());
  std::vector<float> lse_f(lse.size()), dq_f(q.size()), dkv_f(kv.size());
  std::vector<float> sf(static_cast<std::size_t>(cpu::cross_attention_scratch(steps, positions, hd, true, cpu::threads())));
  cpu::cross_attention_fwd<hd>(att_b.data(), lse_f.data(), q_b.data(), kv_b.data(), mask_f.data(), batch, steps,
                               positions, heads, d, sf.data(), index_t(sf.size()));
  cpu::cross_attention_bwd<hd>(dq_f.data(), dkv_f.data(), dout_b.data(), q_b.data(), kv_b.data(), lse_f.data(),
                               mask_f.data(), batch, steps, positions, heads, d, sf.data(), index_t(sf.size()));

  double worst = 0;
  auto within = [&](double got, double want, double bound, const char* what, index_t b, index_t row, index_t col) {
    worst = std::max(worst, std::abs(got - want) / bound);
    if (std::abs(got - want) > bound) {
      INFO(what << " example " << b << " row " << row << " column " << col << ": " << got << " vs " << want
                << ", bound " << bound);
      CHECK(std::abs(got - want) <= bound);
    }
  };
  const auto n = static_cast<std::size_t>(positions);
  std::vector<double> pr(static_cast<std::size_t>(steps) * n), ds(pr.size()), dp(pr.size()), dsum(steps);
  for (index_t b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h) {
      auto qa = [&](const std::vector<double>& t, index_t i, index_t c) {
        return t[static_cast<std::size_t>((b * steps + i) * d + h * hd + c)];
      };
      auto ka = [&](const std::vector<double>& t, index_t j, index_t part, index_t c) {
        return t[static_cast<std::size_t>((b * positions + j) * 2 * d + part * d + h * hd + c)];
      };
      auto valid = [&](index_t j) { return mask[static_cast<std::size_t>(b * positions + j)] != 0.0; };
      for (index_t i = 0; i < steps; ++i) {
        const double l = lse[static_cast<std::size_t>((b * steps + i) * heads + h)];
        const float lf = lse_f[static_cast<std::size_t>((b * steps + i) * heads + h)];
        if (std::isinf(l)) CHECK(lf == l);
        else CHECK(std::abs(lf - l) <= f * (1 + std::abs(l)));
        double D = 0;
        for (index_t j = 0; j < positions; ++j) {
          double s = 0, g = 0;
          for (index_t c = 0; c < hd; ++c) {
            s += qa(q, i, c) * ka(kv, j, 0, c);
            g += qa(dout, i, c) * ka(kv, j, 1, c);
          }
          const std::size_t at = static_cast<std::size_t>(i) * n + static_cast<std::size_t>(j);
          pr[at] = valid(j) && !std::isinf(l) ? std::exp(scale * s - l) : 0.0;
          dp[at] = g;
          D += pr[at] * g;
        }
        dsum[static_cast<std::size_t>(i)] = D;
        for (index_t j = 0; j < positions; ++j) {
          const std::size_t at = static_cast<std::size_t>(i) * n + static_cast<std::size_t>(j);
          ds[at] = pr[at] * (dp[at] - D);
        }
        for (index_t c = 0; c < hd; ++c) {
          double pv = 0;
          for (index_t j = 0; j < positions; ++j)
            pv += pr[static_cast<std::size_t>(i) * n + static_cast<std::size_t>(j)] * std::abs(ka(kv, j, 1, c));
          const double o = qa(att, i, c);
          within(static_cast<float>(att_b[static_cast<std::size_t>((b * steps + i) * d + h * hd + c)]), o,
                 u * std::abs(o) + (pu + f) * pv + 1e-30, "att", b, i, c);
        }
      }
      auto ds_bound = [&](index_t i, index_t j) {
        const std::size_t at = static_cast<std::size_t>(i) * n + static_cast<std::size_t>(j);
        return pu * std::abs(ds[at]) + f * pr[at] * (std::abs(dp[at]) + std::abs(dsum[static_cast<std::size_t>(i)]));
      };
      for (index_t c = 0; c < hd; ++c) {
        for (index_t i = 0; i < steps; ++i) {
          double bq = 0;
          for (index_t j = 0; j < positions; ++j) bq += ds_bound(i, j) * std::abs(ka(kv, j, 0, c));
          within(dq_f[static_cast<std::size_t>((b * steps + i) * d + h * hd + c)], qa(dq, i, c), scale * bq + 1e-30,
                 "dq", b, i, c);
        }
        for (index_t j = 0; j < positions; ++j) {
          double bk = 0, bv = 0;
          for (index_t i = 0; i < steps; ++i) {
            bk += ds_bound(i, j) * std::abs(qa(q, i, c));
            bv += (pu + f) * pr[static_cast<std::size_t>(i) * n + static_cast<std::size_t>(j)] * std::abs(qa(dout, i, c));
          }
          const auto got = [&](index_t part) {
            return double(dkv_f[static_cast<std::size_t>((b * positions + j) * 2 * d + part * d + h * hd + c)]);
          };
          within(got(0), ka(dkv, j, 0, c), scale * bk + 1e-30, "dk", b, j, c);
          within(got(1), ka(dkv, j, 1, c), bv + 1e-30, "dv", b, j, c);
        }
      }
    }
  std::printf("bf16 cross-attention (%s), S=%ld L=%ld: largest error %.2f of its bound\n",
              cpu::bf16_dot_products() ? "bf16 dot products" : "widened to float", static_cast<long>(steps),
              static_cast<long>(positions), worst);
  return att_b;
}

}  // namespace

TEST_CASE("bf16 cross-attention stays within the rounding of its probabilities and dS", "[ops][cross_attention]") {
  INFO(cpu::bf16_products());
  const auto att = check_bf16_cross_attention(cpu::cross_rows + 9, 40, 2);
  if (cpu::bf16_dot_products()) {
    etude::test::bf16_path_scope widened(etude::test::bf16_path::widened);
    CHECK(!same_bits(att, check_bf16_cross_attention(cpu::cross_rows + 9, 40, 2)));
  }
}
