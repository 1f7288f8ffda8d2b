// CUDA's own questions about its op set, apart from the op tests written once for every backend
// (tests/ops/<op>.cpp, compiled into the same programs in CUDA's category, tests/ops/category_cuda.hpp,
// and checked there against the fp64 oracle or the CPU): the device query, cuBLASLt's plan cache,
// TF32 products within their bound, and what CUDA refuses that the CPU takes (a layernorm dim that is
// no multiple of its vector width, a head dimension it has no kernel for).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "etude/backend/cpu/cpu.hpp"
#include "../ops/oracle.hpp"
#include "ops_device.hpp"

namespace {

using etude::index_t;
using etude::gpu_test::dtype;
using etude::gpu_test::vec;
using cpu = etude::backend::cpu;
namespace dev = etude::gpu_test;

using etude::test::ops::check_within;
using etude::test::ops::uniform;

vec abs_of(vec x) {
  for (float& v : x) v = std::fabs(v);
  return x;
}

}  // namespace

TEST_CASE("gpu device present", "[gpu]") {
  INFO("device: " << dev::device_name());
  REQUIRE(dev::device_count() > 0);
}

TEST_CASE("gemm reuses its cached cuBLASLt plan for a repeated product", "[gpu][gemm]") {
  // tests/ops/gemm.cpp checks the values on every backend; here only CUDA's plan cache
  const index_t m = 37, n = 45, k = 29;
  for (dtype t : {dtype::f32, dtype::bf16}) {
    const vec a = uniform(static_cast<std::size_t>(m * k), -1, 1, 1, t), b = uniform(static_cast<std::size_t>(k * n), -1, 1, 2, t);
    vec c(static_cast<std::size_t>(m * n), 0.0f);
    CHECK(dev::gemm(t, t, false, false, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n, false, 2) == 1);
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

TEST_CASE("layernorm refuses a dim that is no multiple of the vector width", "[gpu][layernorm]") {
  const vec x(3 * 20, 1.0f), g(20, 1.0f), b(20, 0.0f);
  CHECK_THROWS_AS(dev::layernorm_fwd(dtype::f32, x, {}, g, b, 3, 20), etude::error);
}

TEST_CASE("attention refuses unsupported head dimensions", "[gpu][attention]") {
  const vec qkv(static_cast<std::size_t>(2 * 3 * 96), 0.0f);
  CHECK_THROWS_AS(dev::attention_fwd(dtype::f32, qkv, 1, 2, 1, 96), etude::error);
}
