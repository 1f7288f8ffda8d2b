// The matrix products, written once for every backend (the category file ETUDE_OPS_CATEGORY names
// it: tests/ops/category_cpu.hpp in test_ops, category_cuda.hpp in test_gpu_ops and test_sim_ops):
// every transpose, storage dtype and output type, and the GELU epilogue, against the exact product
// of the stored values (double), within bounds from the dtype. On the CPU only: CBLAS (double,
// float) and the tiled path for 16-bit operands (several tiles in each dimension), `=` and `+=`;
// the GELU epilogue against the pair it stands for, bit for bit; every bf16 and float path this
// CPU has (etude's kernels, oneDNN where the program links it, widened). CUDA's own questions
// (its plan cache, TF32) are in tests/gpu/ops.cpp.
#include ETUDE_OPS_CATEGORY

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>

#include "ops/oracle.hpp"

#ifdef TEST_BACKEND_CPU
#include <omp.h>

#include <etude/etude.hpp>

#include "product_paths.hpp"
#endif

using etude::index_t;
using namespace etude::test::ops;

namespace {

vec abs_of(vec x) {
  for (float& v : x) v = std::fabs(v);
  return x;
}

// op(A)·op(B) in double of the stored values: alpha·product + beta·c0, and the product of the
// magnitudes (for the bounds), both m×n with leading dimension ldc.
struct exact_product {
  std::vector<double> c, magnitudes;
};
exact_product exact(bool ta, bool tb, index_t m, index_t n, index_t k, double alpha, const vec& a, index_t lda,
                    const vec& b, index_t ldb, double beta, const vec& c0, index_t ldc) {
  exact_product r{as_double(c0), std::vector<double>(c0.size(), 0.0)};
  naive_gemm(ta, tb, std::size_t(m), std::size_t(n), std::size_t(k), alpha, as_double(a), std::size_t(lda),
             as_double(b), std::size_t(ldb), beta, r.c, std::size_t(ldc));
  naive_gemm(ta, tb, std::size_t(m), std::size_t(n), std::size_t(k), 1.0, as_double(abs_of(a)), std::size_t(lda),
             as_double(abs_of(b)), std::size_t(ldb), 0.0, r.magnitudes, std::size_t(ldc));
  return r;
}

}  // namespace

TEST_CASE(TEST_BACKEND_NAME ": gemm within float roundings of the exact product for every transpose, dtype and "
          "output type",
          "[ops][gemm]") {
  // m, n, k not multiples of any tile; leading dimensions past the rows, rounded up to 8 elements
  // (16 bytes of 16-bit values: what cuBLASLt's tensor-core algorithms need, as the model's shapes give)
  const index_t m = 37, n = 45, k = 29;
  auto ld = [](index_t v) { return (v + 1 + 7) / 8 * 8; };
  for (dtype ab : {dtype::f32, dtype::bf16, dtype::f16})
    for (dtype c : {ab, dtype::f32}) {
      if (ab == dtype::f32 && c != ab) continue;
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const index_t lda = ld(ta ? m : k), ldb = ld(tb ? k : n), ldc = ld(n);
          const index_t a_rows = ta ? k : m, b_rows = tb ? n : k;
          const vec a = uniform(static_cast<std::size_t>(a_rows * lda), -1, 1, 1, ab);
          const vec b = uniform(static_cast<std::size_t>(b_rows * ldb), -1, 1, 2, ab);
          const vec c0 = uniform(static_cast<std::size_t>(m * ldc), -1, 1, 3, c);
          const float alpha = 0.75f, beta = c == dtype::f32 && ab != dtype::f32 ? 1.0f : 0.5f;
          const auto want = exact(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, ldc);
          vec got = c0;
          TEST_BACKEND::gemm(ab, c, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, got, ldc);
          // fp32 accumulation, any order: 2·k·2^-24·Σ|αab| (+ |βc| once); then one rounding to C's
          // dtype: u_C·|result|.
          vec bound(want.c.size());
          for (std::size_t i = 0; i < bound.size(); ++i)
            bound[i] = static_cast<float>(2.0 * (k + 2) * 0x1p-24 * (alpha * want.magnitudes[i] + std::fabs(beta * c0[i])) +
                                          unit_roundoff(c) * std::fabs(want.c[i]) + 1e-30);
          check_within(got, as_float(want.c), bound,
                       std::string(TEST_BACKEND_NAME " gemm ") + name(ab) + "->" + name(c) + (ta ? " T" : " N") +
                           (tb ? "T" : "N"));
        }
    }
}

TEST_CASE(TEST_BACKEND_NAME ": gemm_gelu writes the product and its exact-erf GELU", "[ops][gemm]") {
  const index_t m = 33, n = 40, k = 24;
  for (dtype t : {dtype::f32, dtype::bf16}) {
    const vec a = uniform(static_cast<std::size_t>(m * k), -1, 1, 6, t), b = uniform(static_cast<std::size_t>(n * k), -1, 1, 7, t);
    vec pre(static_cast<std::size_t>(m * n), 0.0f), act = pre;
    const auto want = exact(false, true, m, n, k, 1.0, a, k, b, k, 0.0, pre, n);
    TEST_BACKEND::gemm_gelu(t, false, true, m, n, k, a, k, b, k, pre, act, n);
    vec bound(want.c.size());
    for (std::size_t i = 0; i < bound.size(); ++i)
      bound[i] = static_cast<float>(2.0 * k * 0x1p-24 * want.magnitudes[i] + unit_roundoff(t) * std::fabs(want.c[i]));
    check_within(pre, as_float(want.c), bound, std::string(TEST_BACKEND_NAME " gemm_gelu pre ") + name(t));
    // act from the backend's own pre: GELU in float within a few ulp of the exact x·Φ(x), one rounding
    vec want_act(pre.size());
    for (std::size_t i = 0; i < pre.size(); ++i) {
      const double x = pre[i];
      want_act[i] = static_cast<float>(0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))));
    }
    check_close(act, want_act, unit_roundoff(t) + 1e-6, 1e-7, std::string(TEST_BACKEND_NAME " gemm_gelu act ") + name(t));
  }
}

#ifdef TEST_BACKEND_CPU

using cpu = etude::backend::cpu;

namespace {

template <class T>
std::vector<T> stored(const std::vector<double>& v) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = T(static_cast<float>(v[i]));
  return out;
}
template <>
std::vector<double> stored<double>(const std::vector<double>& v) {
  return v;
}
template <class T>
std::vector<double> widened(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(static_cast<float>(v[i]));
  return out;
}
template <>
std::vector<double> widened<double>(const std::vector<double>& v) {
  return v;
}

// op(A)·op(B) for (m, n, k) with A and B stored as T, C as TC, against the naive product of the
// values as stored; tol relative to the row's magnitude.
template <class T, class TC>
void check_products(index_t m, index_t n, index_t k, double tol) {
  std::vector<float> ws(static_cast<std::size_t>(cpu::gemm_workspace_floats));
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (double beta : {0.0, 1.0}) {
        INFO("ta " << ta << " tb " << tb << " beta " << beta);
        const auto a = stored<T>(random_vector(static_cast<std::size_t>(m * k), 31));
        const auto b = stored<T>(random_vector(static_cast<std::size_t>(k * n), 32));
        auto c = stored<TC>(random_vector(static_cast<std::size_t>(m * n), 33));
        auto want = widened(c);
        const index_t lda = ta ? m : k, ldb = tb ? k : n;
        naive_gemm(ta, tb, std::size_t(m), std::size_t(n), std::size_t(k), 0.5, widened(a), std::size_t(lda),
                   widened(b), std::size_t(ldb), beta, want, std::size_t(n));
        cpu::gemm(ta, tb, m, n, k, 0.5, a.data(), lda, b.data(), ldb, beta, c.data(), n, ws.data());
        const auto got = widened(c);
        double worst = 0;
        for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
        CHECK(worst <= tol * std::sqrt(double(k)));
      }
}

}  // namespace

TEST_CASE("gemm: every transpose, = and +=, against the naive product", "[ops]") {
  check_products<double, double>(7, 5, 9, 1e-15);
  check_products<float, float>(33, 17, 65, 1e-6);
  // 16-bit operands take the tiled path: more than one 512-wide tile in k and in m
  check_products<etude::bf16, float>(600, 40, 530, 1e-6);
  check_products<etude::bf16, etude::bf16>(70, 520, 30, 1e-2);
  check_products<etude::fp16, float>(9, 13, 1030, 1e-6);
}

TEST_CASE("gemm with a 16-bit operand and no workspace: the same bits on the thread's own tiles", "[ops]") {
  // fp16 always widens (bf16 on every path: check_paths below); more than one tile in k and in n
  const index_t m = 40, n = 600, k = 530;
  const auto a = stored<etude::fp16>(random_vector(std::size_t(m * k), 81));
  const auto b = stored<etude::fp16>(random_vector(std::size_t(k * n), 82));
  std::vector<float> ws(static_cast<std::size_t>(cpu::gemm_workspace_floats));
  std::vector<etude::fp16> with(std::size_t(m * n)), without(with.size());
  cpu::gemm(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.0, with.data(), n, ws.data());
  cpu::gemm(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.0, without.data(), n);
  CHECK(std::memcmp(with.data(), without.data(), with.size() * sizeof(etude::fp16)) == 0);
  CHECK(std::any_of(with.begin(), with.end(), [](etude::fp16 v) { return float(v) != 0.0f; }));
}

template <class T>
void check_gemm_gelu() {
  const index_t m = 12, n = 10, k = 16, ldc = 14;  // a leading dimension wider than the product
  std::vector<float> ws(static_cast<std::size_t>(cpu::gemm_workspace_floats));
  const auto a = stored<T>(random_vector(std::size_t(m * k), 41, 2.0));
  const auto b = stored<T>(random_vector(std::size_t(n * k), 42, 2.0));
  std::vector<T> pre(std::size_t(m * ldc)), act(pre.size()), want_pre(pre.size()), want_act(pre.size());
  cpu::gemm_gelu(false, true, m, n, k, a.data(), k, b.data(), k, pre.data(), act.data(), ldc, ws.data());
  cpu::gemm(false, true, m, n, k, 1.0, a.data(), k, b.data(), k, 0.0, want_pre.data(), ldc, ws.data());
  for (index_t r = 0; r < m; ++r) cpu::gelu_fwd(want_act.data() + r * ldc, want_pre.data() + r * ldc, n);
  CHECK(std::memcmp(pre.data(), want_pre.data(), pre.size() * sizeof(T)) == 0);
  CHECK(std::memcmp(act.data(), want_act.data(), act.size() * sizeof(T)) == 0);
}

TEST_CASE("gemm_gelu is the product then gelu_fwd, bit for bit", "[ops]") {
  check_gemm_gelu<double>();
  check_gemm_gelu<float>();
  check_gemm_gelu<etude::bf16>();
  STATIC_REQUIRE(etude::ops::fuses_gemm_gelu<cpu>);
}

// A workspace filled with a pattern no product writes, to show a product left it alone.
constexpr std::uint32_t untouched = 0x7fc0dead;
void mark(std::vector<float>& ws) {
  for (float& w : ws) std::memcpy(&w, &untouched, sizeof w);
}
bool unmarked(const std::vector<float>& ws) {
  for (const float w : ws)
    if (std::memcmp(&w, &untouched, sizeof w) != 0) return true;
  return false;
}

// `each(t)` on two threads of one parallel region at once, every thread's result kept.
template <class F>
auto on_two_threads(const F& each) {
  std::array<decltype(each(0)), 2> out;
#pragma omp parallel num_threads(2)
  out[std::size_t(omp_get_thread_num())] = each(omp_get_thread_num());
  return out;
}

// What products inside a parallel region promise on every path (cpu_gemm's header): the same bits
// as each product alone at top level on one thread, and the caller's workspace, shared by the
// region's threads, never touched.
// GELU and its backward as epilogues of the bf16 kernels (cpu::gelu_epilogues(): each block of the
// product looked up while in cache) against the product followed by the elementwise pass: the same
// bits, on shapes that take each of the kernels' schedules (B packed once, packed in passes, packed
// panel by panel), blocks cut short in rows and columns, a leading dimension wider than the product,
// with the caller's workspace, without one, and inside a parallel region (two threads each a product
// of its own rows, handed the same workspace). On the other paths the pair itself. Against the
// whole product at top level where etude's kernels multiply (the same bits on any team and any cut
// of rows), else against each thread's rows multiplied alone on one thread (oneDNN promises the
// same bits for one shape and thread count, no more). Pre-activations of about ±2, where GELU bends.
void check_gelu_epilogues(bool tb, index_t m, index_t n, index_t k, bool with_workspace, bool nested) {
  using etude::bf16;
  INFO("tb " << tb << " m " << m << " n " << n << " k " << k << " workspace " << with_workspace << " nested "
             << nested << " epilogues " << cpu::gelu_epilogues() << " path " << cpu::bf16_products());
  const index_t ldc = n + 3, ldb = tb ? k : n;
  const double s = 2.0 / std::pow(double(k), 0.25);
  const auto a = stored<bf16>(random_vector(std::size_t(m * k), 51, s));
  const auto b = stored<bf16>(random_vector(std::size_t(n * k), 52, s));
  const auto other = stored<bf16>(random_vector(std::size_t(m * ldc), 53, 4.0));  // a pre-activation for dy
  std::vector<float> ws(static_cast<std::size_t>(cpu::gemm_workspace_floats));
  float* w = with_workspace ? ws.data() : nullptr;
  const std::size_t size = std::size_t(m * ldc);
  std::vector<bf16> pre(size, bf16(7.0f)), act(size, bf16(7.0f)), dy(size, bf16(7.0f));
  std::vector<bf16> want_pre = pre, want_act = act, want_dy = dy;
  const int teams = nested ? 2 : 1;
  const index_t part = (m + teams - 1) / teams;
  // each of `teams` threads computes rows [t·part, ...) with a product of its own
  auto run = [&](auto&& each) {
#pragma omp parallel for num_threads(teams) if (nested)
    for (int t = 0; t < teams; ++t) {
      const index_t r0 = t * part, rows = std::min(m, r0 + part) - r0;
      if (rows > 0) each(r0, rows);
    }
  };
  if (nested) mark(ws);
  run([&](index_t r0, index_t rows) {
    cpu::gemm_gelu(false, tb, rows, n, k, a.data() + r0 * k, k, b.data(), ldb, pre.data() + r0 * ldc,
                   act.data() + r0 * ldc, ldc, w);
    cpu::gemm_gelu_bwd(false, tb, rows, n, k, a.data() + r0 * k, k, b.data(), ldb, dy.data() + r0 * ldc,
                       other.data() + r0 * ldc, ldc, w);
  });
  if (nested) CHECK_FALSE(unmarked(ws));
  const bool by_parts = nested && !cpu::own_bf16_products();
  const int team = omp_get_max_threads();
  if (by_parts) omp_set_num_threads(1);
  for (index_t r0 = 0; r0 < m; r0 += by_parts ? part : m) {
    const index_t rows = std::min(m - r0, by_parts ? part : m);
    cpu::gemm(false, tb, rows, n, k, 1.0, a.data() + r0 * k, k, b.data(), ldb, 0.0, want_pre.data() + r0 * ldc, ldc,
              ws.data());
    cpu::gemm(false, tb, rows, n, k, 1.0, a.data() + r0 * k, k, b.data(), ldb, 0.0, want_dy.data() + r0 * ldc, ldc,
              ws.data());
  }
  omp_set_num_threads(team);
  for (index_t r = 0; r < m; ++r) {
    cpu::gelu_fwd(want_act.data() + r * ldc, want_pre.data() + r * ldc, n);
    cpu::gelu_bwd(want_dy.data() + r * ldc, other.data() + r * ldc, n);
  }
  CHECK(std::memcmp(pre.data(), want_pre.data(), size * sizeof(bf16)) == 0);
  CHECK(std::memcmp(act.data(), want_act.data(), size * sizeof(bf16)) == 0);
  CHECK(std::memcmp(dy.data(), want_dy.data(), size * sizeof(bf16)) == 0);
  // the values GELU bends over were met: some pre-activations in (−2, 2) away from 0
  index_t bent = 0;
  for (const bf16 v : pre) bent += std::abs(float(v)) > 0.25f && std::abs(float(v)) < 2.0f;
  CHECK(bent > m * n / 4);
}

TEST_CASE("GELU and its backward as epilogues of the bf16 products are the product then the elementwise pass, "
          "bit for bit, on every bf16 path",
          "[ops]") {
  for (const auto path : etude::test::bf16_paths_here()) {
    etude::test::bf16_path_scope on(path);
    INFO("path " << etude::test::name(path));
    // where the bf16 products run on etude's kernels the lookups are their epilogues, not the pass after
    if (cpu::own_bf16_products()) CHECK(cpu::gelu_epilogues());
    check_gelu_epilogues(true, 203, 150, 70, true, false);     // B packed once, blocks of 96 rows and a short one
    check_gelu_epilogues(false, 700, 600, 3000, true, false);  // B in passes: more panels than the workspace holds
    check_gelu_epilogues(false, 90, 520, 3100, true, false);   // panel by panel: B too large, A small
    check_gelu_epilogues(true, 61, 77, 33, false, false);      // no workspace: the thread's own buffer, odd k
    check_gelu_epilogues(true, 97, 130, 64, true, true);       // two products side by side in a parallel region
    check_gelu_epilogues(false, 96, 200, 1000, true, true);    // the same, B not transposed, a long reduction
  }
}

// Products of two bf16 operands go to oneDNN's matmul in a program that links etude::dnnl, on a CPU
// with bf16 dot-product instructions: the same products as the widened path (bf16·bf16 is exact in
// float), summed in another order, so each result within a few float roundings of the sum of
// |a·b|; repeated calls bit-identical; strides wider than the product, alpha and beta as given.
// Float products (oneDNN's f32 matmul or OpenBLAS) meet the same bound: each product's rounding
// is one more of the k + 2.
template <class T, class TC>
void check_paths(bool ta, bool tb, index_t m, index_t n, index_t k, double alpha, double beta) {
  INFO("ta " << ta << " tb " << tb << " m " << m << " n " << n << " k " << k << " alpha " << alpha << " beta "
             << beta);
  const index_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
  const auto a = stored<T>(random_vector(std::size_t((ta ? k : m) * lda), 51));
  const auto b = stored<T>(random_vector(std::size_t((tb ? n : k) * ldb), 52));
  const auto c0 = stored<TC>(random_vector(std::size_t(m * ldc), 53));
  std::vector<float> ws(static_cast<std::size_t>(cpu::gemm_workspace_floats));
  auto run = [&](float* workspace) {
    auto c = c0;
    cpu::gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc, workspace);
    return c;
  };
  const auto got = run(ws.data()), again = run(ws.data());
  CHECK(std::memcmp(got.data(), again.data(), got.size() * sizeof(TC)) == 0);
  // every path: without a workspace the same bits; inside a parallel region, two threads at once
  // handed the same workspace, each the bits of the product alone on one thread, the workspace
  // untouched
  CHECK(std::memcmp(got.data(), run(nullptr).data(), got.size() * sizeof(TC)) == 0);
  const int team = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto alone = run(ws.data());
  omp_set_num_threads(team);
  mark(ws);
  const auto nested = on_two_threads([&](int) { return run(ws.data()); });
  CHECK_FALSE(unmarked(ws));
  for (const auto& each : nested) CHECK(std::memcmp(alone.data(), each.data(), alone.size() * sizeof(TC)) == 0);
  // etude's kernels sum each result in an order fixed by k alone: one thread is two threads' bits
  if (std::is_same_v<T, etude::bf16> && cpu::own_bf16_products())
    CHECK(std::memcmp(got.data(), alone.data(), got.size() * sizeof(TC)) == 0);
  const auto aw = widened(a), bw = widened(b), cw = widened(c0);
  std::vector<double> want = cw, magnitude(want.size());
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double sum = 0, abs_sum = 0;
      for (index_t p = 0; p < k; ++p) {
        const double x = aw[std::size_t(ta ? p * lda + i : i * lda + p)] * bw[std::size_t(tb ? j * ldb + p : p * ldb + j)];
        sum += x;
        abs_sum += std::abs(x);
      }
      const std::size_t at = std::size_t(i * ldc + j);
      want[at] = alpha * sum + beta * want[at];
      magnitude[at] = std::abs(alpha) * abs_sum + std::abs(beta * cw[at]);
    }
  // float accumulation: k roundings of at most 2^-24 each; a bf16 result one more of 2^-8
  const double rel = std::is_same_v<TC, float> ? double(k + 2) * 0x1p-24 : 0x1p-8 + double(k + 2) * 0x1p-24;
  const auto g = widened(got);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      const std::size_t at = std::size_t(i * ldc + j);
      if (std::abs(g[at] - want[at]) > rel * magnitude[at] + 1e-30) {
        FAIL_CHECK("(" << i << ", " << j << "): " << g[at] << " against " << want[at]);
        return;
      }
    }
  // the padding between rows of C is never written
  for (index_t i = 0; i < m; ++i)
    for (index_t j = n; j < ldc; ++j)
      CHECK(std::memcmp(&got[std::size_t(i * ldc + j)], &c0[std::size_t(i * ldc + j)], sizeof(TC)) == 0);
}

// A path name says oneDNN in a program that links it, and why not in one that does not.
void check_named(const std::string& path) {
  INFO(path);
#ifdef ETUDE_WITH_DNNL
  CHECK(path.find("oneDNN") != std::string::npos);
#else
  CHECK(path.find("built without oneDNN") != std::string::npos);
#endif
}

TEST_CASE("bf16 products: the path bf16_products() names, within float roundings of the exact sums, on every "
          "bf16 path",
          "[ops]") {
  for (const auto path : etude::test::bf16_paths_here()) {
    etude::test::bf16_path_scope on(path);
    INFO("path " << etude::test::name(path) << ": " << cpu::bf16_products());
    if (path != etude::test::bf16_path::own) check_named(cpu::bf16_products());
    CHECK((cpu::bf16_products().rfind("etude's", 0) == 0) == (path == etude::test::bf16_path::own));
    CHECK((cpu::bf16_products().rfind("oneDNN", 0) == 0) == (path == etude::test::bf16_path::onednn));
    CHECK((cpu::bf16_products().rfind("fp32 sgemm on widened", 0) == 0) == (path == etude::test::bf16_path::widened));
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        check_paths<etude::bf16, float>(ta, tb, 37, 70, 300, 1.0, 0.0);
        check_paths<etude::bf16, float>(ta, tb, 37, 70, 300, 0.5, 1.0);
        check_paths<etude::bf16, etude::bf16>(ta, tb, 64, 33, 129, 1.0, 0.0);
        check_paths<etude::bf16, etude::bf16>(ta, tb, 64, 33, 129, 0.125, 1.0);
      }
    // op(B) larger than the workspace (a weight gradient's shape: both of tile_product::gemm's
    // schedules), an odd reduction, an empty one
    check_paths<etude::bf16, float>(true, false, 40, 1600, 1031, 1.0, 1.0);
    check_paths<etude::bf16, etude::bf16>(false, true, 150, 1600, 1030, 0.5, 0.25);
    check_paths<etude::bf16, etude::bf16>(false, false, 7, 9, 0, 1.0, 0.5);
  }
  if (etude::backend::cpu_detail::tile_product::available()) {
    // a room of two panels: op(B) packed in passes, the same bits as packed at once
    etude::test::bf16_path_scope on(etude::test::bf16_path::own);
    namespace pairs = etude::backend::cpu_detail::tile_product;
    const index_t m = 200, n = 150, k = 130;
    const auto a = stored<etude::bf16>(random_vector(std::size_t(m * k), 71));
    const auto b = stored<etude::bf16>(random_vector(std::size_t(n * k), 72));
    std::vector<etude::bf16> whole(std::size_t(m * n)), passes(whole.size());
    std::vector<float> ws(static_cast<std::size_t>(cpu::gemm_workspace_floats));
    cpu::gemm(false, true, m, n, k, 1.0, a.data(), k, b.data(), k, 0.0, whole.data(), n, ws.data());
    std::vector<pairs::word> room(std::size_t(2 * k / 2 * pairs::panel_columns));
    pairs::gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, passes.data(), n, room.data(),
                room.size() * sizeof(pairs::word));
    CHECK(std::memcmp(whole.data(), passes.data(), whole.size() * sizeof(etude::bf16)) == 0);
  }
}

TEST_CASE("float products: the path float_products() names, and OpenBLAS, within float roundings", "[ops]") {
  check_named(cpu::float_products());
  const auto all_shapes = [] {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        check_paths<float, float>(ta, tb, 37, 70, 300, 1.0, 0.0);
        check_paths<float, float>(ta, tb, 64, 33, 129, 0.125, 1.0);
        check_paths<float, float>(ta, tb, 130, 96, 513, 0.5, 0.5);
      }
  };
  all_shapes();
#ifdef ETUDE_WITH_DNNL
  // OpenBLAS, as in a program without oneDNN or on a CPU without a brgemm kernel
  using etude::backend::cpu_detail::dnnl_operands;
  auto& dnnl = etude::backend::cpu_detail::dnnl_gemm::instance();
  // where the path is live, the products really go there: the two libraries sum a long k in
  // different orders, so some of 130·96 results differ in their last bits
  const bool live = dnnl.active(dnnl_operands::f32);
  CHECK(live == (cpu::float_products().rfind("oneDNN", 0) == 0));
  const index_t m = 130, n = 96, k = 513;
  const auto a = stored<float>(random_vector(std::size_t(m * k), 61));
  const auto b = stored<float>(random_vector(std::size_t(k * n), 62));
  auto product = [&] {
    std::vector<float> c(std::size_t(m * n));
    cpu::gemm(false, false, m, n, k, 1.0, a.data(), k, b.data(), n, 0.0, c.data(), n);
    return c;
  };
  const auto on_path = product();
  dnnl.set_enabled(dnnl_operands::f32, false);
  CHECK(cpu::float_products().find("OpenBLAS") != std::string::npos);
  all_shapes();
  const auto on_openblas = product();
  dnnl.set_enabled(dnnl_operands::f32, true);
  CHECK(live == (std::memcmp(on_path.data(), on_openblas.data(), on_path.size() * sizeof(float)) != 0));
#endif
}

TEST_CASE("bf16 pair products (attention's kernels): both packings, a paired A seen transposed, within float "
          "roundings",
          "[ops]") {
  namespace pairs = etude::backend::cpu_detail::tile_product;
  using etude::bf16;
  if (!pairs::available()) {
#if !defined(ETUDE_CPU_X86_KERNELS)
    // built without the kernels (not x86-64, or not GCC/Clang): product() refuses by name
    const pairs::word* none = nullptr;
    CHECK_THROWS_WITH(pairs::product(1, 1, 1, 1.0f, none, 1, 1, none, 16, 0.0f, static_cast<float*>(nullptr), 1),
                      Catch::Contains("AVX512_BF16"));
#endif
    // (built with them, on a CPU without AVX512_BF16 product() is AVX-512 code its callers never
    // reach: they check available() first, which is what this CPU answered)
    WARN("this CPU has no AVX512_BF16: the pair products are not exercised");
    return;
  }
  // odd and even reductions, partial row tiles (6) and column vectors (16), a 64-column panel and more
  for (const auto [m, n, k] :
       {std::array<index_t, 3>{7, 33, 9}, {64, 64, 130}, {13, 130, 64}, {1, 1, 1}, {70, 17, 2}}) {
    INFO("m " << m << " n " << n << " k " << k);
    const index_t even = k + k % 2, pair_count = even / 2, lda = even + 4, ldc = n + 3;
    // A (m × k) in rows of even length (zero past k); B (k × n) once row-major, once stored transposed
    std::vector<bf16> a(std::size_t(m * lda), bf16(0.0f)), b(std::size_t(k * n));
    std::vector<bf16> bt(std::size_t(n * even), bf16(0.0f));
    const auto av = random_vector(std::size_t(m * k), 71), bv = random_vector(std::size_t(k * n), 72);
    for (index_t i = 0; i < m; ++i)
      for (index_t p = 0; p < k; ++p) a[std::size_t(i * lda + p)] = bf16(float(av[std::size_t(i * k + p)]));
    for (index_t p = 0; p < k; ++p)
      for (index_t j = 0; j < n; ++j)
        bt[std::size_t(j * even + p)] = b[std::size_t(p * n + j)] = bf16(float(bv[std::size_t(p * n + j)]));
    // A transposed (k × m), its rows paired: A(i, p) is word p·ldp + i
    std::vector<bf16> at(std::size_t(k * m));
    for (index_t i = 0; i < m; ++i)
      for (index_t p = 0; p < k; ++p) at[std::size_t(p * m + i)] = a[std::size_t(i * lda + p)];
    const index_t ldb = pairs::padded(n) + 16, ldp = pairs::padded(m);
    std::vector<pairs::word> by_rows(std::size_t(pair_count * ldb), 0xFFFFFFFFu);
    std::vector<pairs::word> by_columns(by_rows.size(), 0xFFFFFFFFu), a_paired(std::size_t(pair_count * ldp));
    pairs::pack_rows(by_rows.data(), ldb, b.data(), n, k, n);
    pairs::pack_columns(by_columns.data(), ldb, bt.data(), even, n, even);
    pairs::pack_rows(a_paired.data(), ldp, at.data(), m, k, m);
    // the packings hold the same words, zeros to the next 16 columns, nothing past them
    for (index_t q = 0; q < pair_count; ++q) {
      for (index_t j = 0; j < pairs::padded(n); ++j)
        CHECK(by_rows[std::size_t(q * ldb + j)] == by_columns[std::size_t(q * ldb + j)]);
      for (index_t j = pairs::padded(n); j < ldb; ++j) CHECK(by_rows[std::size_t(q * ldb + j)] == 0xFFFFFFFFu);
    }
    for (index_t j = 0; j < pairs::padded(n); ++j) {  // the odd last row pairs with zeros
      const pairs::word last = by_rows[std::size_t((pair_count - 1) * ldb + j)];
      CHECK((k % 2 == 0 || j >= n || last >> 16 == 0));
    }
    const auto* a_rows = reinterpret_cast<const pairs::word*>(a.data());
    for (const float beta : {0.0f, 0.5f}) {
      const auto c0 = random_vector(std::size_t(m * ldc), 73);
      std::vector<float> c1(c0.begin(), c0.end()), c2 = c1, c3 = c1;
      pairs::product(m, n, pair_count, 0.25f, a_rows, lda / 2, 1, by_rows.data(), ldb, beta, c1.data(), ldc);
      pairs::product(m, n, pair_count, 0.25f, a_rows, lda / 2, 1, by_columns.data(), ldb, beta, c2.data(), ldc);
      pairs::product(m, n, pair_count, 0.25f, a_paired.data(), 1, ldp, by_rows.data(), ldb, beta, c3.data(), ldc);
      CHECK(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)) == 0);  // the same words, the same order
      double worst = 0.0;
      for (index_t i = 0; i < m; ++i) {
        for (index_t j = 0; j < n; ++j) {
          double sum = 0.0, magnitude = 0.0;
          for (index_t p = 0; p < k; ++p) {
            const double t = double(float(a[std::size_t(i * lda + p)])) * double(float(b[std::size_t(p * n + j)]));
            sum += t;
            magnitude += std::abs(t);
          }
          const double c = double(float(c0[std::size_t(i * ldc + j)]));
          const double want = 0.25 * sum + beta * c;
          const double bound = double(k + 2) * 0x1p-24 * (0.25 * magnitude + beta * std::abs(c));
          for (const auto* got : {&c1, &c3})
            worst = std::max(worst, std::abs(double((*got)[std::size_t(i * ldc + j)]) - want) / (bound + 1e-30));
        }
        // the padding between rows of C is never written
        for (index_t j = n; j < ldc; ++j) {
          CHECK(c1[std::size_t(i * ldc + j)] == float(c0[std::size_t(i * ldc + j)]));
          CHECK(c3[std::size_t(i * ldc + j)] == float(c0[std::size_t(i * ldc + j)]));
        }
      }
      CHECK(worst <= 1.0);
    }
  }
}

TEST_CASE("bf16 pair products of a causal operand skip only what is zero or unread: the full product's bits",
          "[ops]") {
  namespace pairs = etude::backend::cpu_detail::tile_product;
  using etude::bf16;
  using causal = pairs::causal;
  if (!pairs::available()) {
    WARN("this CPU has no AVX512_BF16: the pair products are not exercised");
    return;
  }
  // rows of C standing for queries (or keys) offset + i: tiles of 6 and runs of 16 meeting a
  // diagonal at any place, odd reductions, partial and several 64-column panels
  for (const auto [m, n, k, offset] : {std::array<index_t, 4>{64, 128, 128, 64}, {37, 70, 71, 33}, {17, 16, 40, 0},
                                       {70, 150, 150, 80}, {5, 9, 9, 3}, {64, 64, 64, 0}}) {
    const index_t pair_count = (k + 1) / 2, ldc = n + 5, ldb = pairs::padded(n);
    const auto av = random_vector(std::size_t(m * 2 * pair_count), 81), bv = random_vector(std::size_t(k * n), 82);
    std::vector<bf16> b(std::size_t(k * n));
    for (std::size_t x = 0; x < b.size(); ++x) b[x] = bf16(float(bv[x]));
    std::vector<pairs::word> bp(std::size_t(pair_count * ldb));
    pairs::pack_rows(bp.data(), ldb, b.data(), n, k, n);
    for (const auto what : {causal::columns_to_row, causal::reduction_to_row, causal::reduction_from_row}) {
      INFO("m " << m << " n " << n << " k " << k << " offset " << offset << " kind " << int(what));
      // A (m × k) in rows of even length, zero where the kind says it is (and past k)
      const index_t lda = 2 * pair_count;
      std::vector<bf16> a(std::size_t(m * lda), bf16(0.0f));
      for (index_t i = 0; i < m; ++i)
        for (index_t p = 0; p < k; ++p) {
          const bool zero = (what == causal::reduction_to_row && p > offset + i) ||
                            (what == causal::reduction_from_row && p < offset + i);
          if (!zero) a[std::size_t(i * lda + p)] = bf16(float(av[std::size_t(i * lda + p)]));
        }
      const auto* aw = reinterpret_cast<const pairs::word*>(a.data());
      for (const float beta : {0.0f, 0.5f}) {
        const auto c0 = random_vector(std::size_t(m * ldc), 83);
        std::vector<float> full(c0.begin(), c0.end()), cut = full;
        pairs::product(m, n, pair_count, 0.5f, aw, lda / 2, 1, bp.data(), ldb, beta, full.data(), ldc);
        pairs::product(m, n, pair_count, 0.5f, aw, lda / 2, 1, bp.data(), ldb, beta, cut.data(), ldc,
                       causal{what, offset});
        index_t differ = 0, skipped = 0;
        for (index_t i = 0; i < m; ++i)
          for (index_t j = 0; j < ldc; ++j) {
            const auto x = std::size_t(i * ldc + j);
            if (what == causal::columns_to_row && j > offset + i) {
              // unwanted: the full product's, or left as it was; the padding past n never written
              if (j >= n) CHECK(cut[x] == float(c0[x]));
              skipped += cut[x] == float(c0[x]) && j < n;
              continue;
            }
            differ += std::memcmp(&full[x], &cut[x], sizeof(float)) != 0;
          }
        CHECK(differ == 0);
        // the cut leaves vectors of the masked corner unwritten where row 0 has one past its keys
        if (what == causal::columns_to_row && offset / 16 + 1 < (n + 15) / 16) CHECK(skipped > 0);
      }
    }
  }
}

TEST_CASE("bf16 pair products round a bf16 C as bf16(float) rounds, whole vector pairs, NaN and infinity included",
          "[ops]") {
  namespace pairs = etude::backend::cpu_detail::tile_product;
  using etude::bf16;
  if (!pairs::available()) {
    WARN("this CPU has no AVX512_BF16: the pair products are not exercised");
    return;
  }
  // 70 columns: one whole 64-column panel (its vectors rounded in pairs), then a masked rest; a
  // row of A with an infinity and one with a NaN make infinite and NaN outputs
  const index_t m = 13, n = 70, k = 40, pair_count = k / 2, ldb = pairs::padded(n);
  const auto av = random_vector(std::size_t(m * k), 91), bv = random_vector(std::size_t(k * n), 92);
  std::vector<bf16> a(std::size_t(m * k)), b(std::size_t(k * n));
  for (std::size_t x = 0; x < a.size(); ++x) a[x] = bf16(float(av[x]) * (x % 7 == 0 ? 1e30f : 1.0f));
  for (std::size_t x = 0; x < b.size(); ++x) b[x] = bf16(float(bv[x]));
  a[std::size_t(3 * k + 5)] = bf16(INFINITY);
  a[std::size_t(7 * k + 2)] = bf16(std::nanf(""));
  std::vector<pairs::word> bp(std::size_t(pair_count * ldb));
  pairs::pack_rows(bp.data(), ldb, b.data(), n, k, n);
  const auto* aw = reinterpret_cast<const pairs::word*>(a.data());
  std::vector<float> wide(std::size_t(m * n));
  std::vector<bf16> narrow(wide.size());
  pairs::product(m, n, pair_count, 1.0f, aw, k / 2, 1, bp.data(), ldb, 0.0f, wide.data(), n);
  pairs::product(m, n, pair_count, 1.0f, aw, k / 2, 1, bp.data(), ldb, 0.0f, narrow.data(), n);
  index_t differ = 0, special = 0;
  for (std::size_t x = 0; x < wide.size(); ++x) {
    differ += bf16(wide[x]).bits != narrow[x].bits;
    special += !std::isfinite(wide[x]);
  }
  CHECK(differ == 0);
  CHECK(special >= 2 * n - 2);  // the two rows, less what the infinity meets as a zero

  // float words (the kernels' vfmadd231ps form) make subnormal outputs, which the pair rounding
  // instruction would read as zero: they must round as bf16(float) rounds them too
  std::vector<float> af(std::size_t(m * k)), bf(std::size_t(k * ldb), 0.0f);
  for (std::size_t x = 0; x < af.size(); ++x) af[x] = float(av[x]) * 1e-20f;
  for (index_t p = 0; p < k; ++p)
    for (index_t j = 0; j < n; ++j) bf[std::size_t(p * ldb + j)] = float(bv[std::size_t(p * n + j)]) * 1e-19f;
  std::vector<float> wide_f(wide.size());
  std::vector<bf16> narrow_f(wide.size());
  pairs::product(m, n, k, 1.0f, af.data(), k, 1, bf.data(), ldb, 0.0f, wide_f.data(), n);
  pairs::product(m, n, k, 1.0f, af.data(), k, 1, bf.data(), ldb, 0.0f, narrow_f.data(), n);
  index_t differ_f = 0, subnormal = 0;
  for (std::size_t x = 0; x < wide_f.size(); ++x) {
    differ_f += bf16(wide_f[x]).bits != narrow_f[x].bits;
    subnormal += std::fpclassify(wide_f[x]) == FP_SUBNORMAL;
  }
  CHECK(differ_f == 0);
  CHECK(subnormal > 0);
}

#endif  // TEST_BACKEND_CPU
