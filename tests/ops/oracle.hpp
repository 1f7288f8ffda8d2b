// What the op tests share: seeded random inputs, central differences, the fp64 forms every
// backend's op is checked against, and the run-time dtypes' rounding and bounds (tests/ops/runs.hpp)
// with the checks that report how many elements fall outside a bound.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <etude/core/dtype.hpp>
#include <etude/core/rng.hpp>

#include "runs.hpp"

namespace etude::test::ops {

using runs::attn_fwd_out;
using runs::check_result;
using runs::dtype;
using runs::ln_fwd_out;
using runs::tokens;
using runs::vec;

inline std::vector<double> random_vector(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  etude::rng r(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = r.uniform(-scale, scale);
  return v;
}

// Checks grad (analytic d loss / d x) against central differences of loss at every element.
// With a stride, every stride-th element (the forward is re-run twice per element).
inline void check_gradient(std::vector<double>& x, const std::vector<double>& grad, const std::function<double()>& loss,
                           const char* what, std::size_t stride = 1) {
  INFO(what);
  for (std::size_t i = 0; i < x.size(); i += stride) {
    const double keep = x[i], h = 1e-6 * std::max(1.0, std::abs(keep));
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    const double numeric = (up - down) / (2 * h);
    INFO("element " << i);
    CHECK(grad[i] == Approx(numeric).epsilon(1e-6).margin(1e-8));
  }
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// C(m, n) = alpha·op(A)·op(B) + beta·C, row-major, summed in double: the products' oracle.
inline void naive_gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, double alpha,
                       const std::vector<double>& a, std::size_t lda, const std::vector<double>& b, std::size_t ldb,
                       double beta, std::vector<double>& c, std::size_t ldc) {
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::size_t p = 0; p < k; ++p) s += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = alpha * s + beta * c[i * ldc + j];
    }
}

inline const char* name(dtype t) { return t == dtype::bf16 ? "bf16" : t == dtype::f16 ? "fp16" : "f32"; }

// The unit roundoff of a value stored in dtype t.
inline double unit_roundoff(dtype t) {
  switch (t) {
    case dtype::bf16: return dtype_traits<bf16>::unit_roundoff;
    case dtype::f16: return dtype_traits<fp16>::unit_roundoff;
    default: return dtype_traits<float>::unit_roundoff;
  }
}

// f(value of the host storage type of t).
template <class F>
decltype(auto) host_dispatch(dtype t, F&& f) {
  switch (t) {
    case dtype::bf16: return f(bf16{});
    case dtype::f16: return f(fp16{});
    default: return f(float{});
  }
}

inline float round_to(dtype t, float x) {
  switch (t) {
    case dtype::bf16: return static_cast<float>(etude::bf16(x));
    case dtype::f16: return static_cast<float>(etude::fp16(x));
    default: return x;
  }
}
inline vec round_to(dtype t, vec x) {
  for (float& v : x) v = round_to(t, v);
  return x;
}

// n values uniform in [lo, hi) from seed, each rounded to t: both backends see identical values.
inline vec uniform(std::size_t n, float lo, float hi, std::uint32_t seed, dtype t = dtype::f32) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  vec v(n);
  for (float& x : v) x = round_to(t, d(gen));
  return v;
}

// The oracle's side of a comparison: the values in double, and its results rounded to float once.
inline std::vector<double> as_double(const vec& v) { return {v.begin(), v.end()}; }
inline vec as_float(const std::vector<double>& v) {
  vec r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(v[i]);
  return r;
}

// Values a bf16 tensor can hold (double copies of them), and the bf16 tensor itself.
inline std::vector<double> rounded(std::vector<double> v) {
  for (auto& x : v) x = static_cast<double>(static_cast<float>(etude::bf16(static_cast<float>(x))));
  return v;
}
inline std::vector<etude::bf16> narrow(const std::vector<double>& v) {
  std::vector<etude::bf16> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = etude::bf16(static_cast<float>(v[i]));
  return b;
}
inline bool same_bits(const std::vector<etude::bf16>& a, const std::vector<etude::bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(etude::bf16)) == 0;
}

// |got − want| <= bound[i] for every i; reports the first few violations.
inline void check_within(const vec& got, const vec& want, const vec& bound, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    if (!(err <= bound[i])) {  // NaN fails too
      if (bad < 5)
        first += "\n  [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " + std::to_string(want[i]) +
                 " bound " + std::to_string(bound[i]);
      ++bad;
    }
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements outside the bound" << first);
  CHECK(bad == 0);
}
// bound = atol + rtol·|want|
inline void check_close(const vec& got, const vec& want, double rtol, double atol, const std::string& what) {
  vec bound(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) bound[i] = static_cast<float>(atol + rtol * std::fabs(want[i]));
  check_within(got, want, bound, what);
}
inline void check_equal(const vec& got, const vec& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) bad += !(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])));
  INFO(what << ": " << bad << " of " << got.size() << " elements differ");
  CHECK(bad == 0);
}
inline bool bit_identical(const vec& a, const vec& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  return true;
}

// Inputs that make an optimiser's check refuse (or not), for the AdamW and SGD cases of every backend:
// `edit` changes p, g, m and v (m: SGD's buffer) of 100003 elements, several blocks of a check's pass.
struct refusal_variant {
  const char* what;
  double lr;
  std::function<void(vec&, vec&, vec&, vec&)> edit;
  bool with_working;
};
inline std::vector<refusal_variant> refusal_variants() {
  return {
      {"a sane learning rate", 1e-3, [](vec&, vec&, vec&, vec&) {}, false},
      {"lr 1e38", 1e38, [](vec&, vec&, vec&, vec&) {}, false},
      {"huge gradients in several blocks", 1e-3,
       [](vec&, vec& gg, vec&, vec&) { gg[70001] = gg[50000] = gg[99999] = 1e20f; }, false},
      {"the moments of one element", 1e-3,
       [](vec&, vec& gg, vec& mm, vec&) {
         gg[81234] = 2e38f;
         mm[81234] = -2e38f;
       },
       false},
      {"an fp16 working copy", 1e-3, [](vec& pp, vec&, vec&, vec&) { pp[4097] = 7e4f; }, true},
  };
}

}  // namespace etude::test::ops
