// The matrix products on the CPU: every transpose against a double-precision naive product, on
// CBLAS (double, float) and on the tiled path for 16-bit operands (several tiles in each
// dimension), `=` and `+=`; the GELU epilogue against the pair it stands for.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include <etude/etude.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

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

TEST_CASE("gemm with a 16-bit operand and no workspace is refused", "[ops]") {
  std::vector<etude::bf16> a(4), b(4), c(4);
  CHECK_THROWS_WITH(cpu::gemm(false, false, 2, 2, 2, 1.0, a.data(), 2, b.data(), 2, 0.0, c.data(), 2),
                    Catch::Contains("workspace"));
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
  STATIC_REQUIRE_FALSE(etude::ops::fuses_gemm_gelu<cpu>);
}
