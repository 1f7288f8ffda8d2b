// The key/value cache ops (ops/kv_cache.hpp) on the CPU against a plain reference: kv_append places
// each new row's k and v at its position and touches nothing else, and refuses rows past the cache;
// cached_attention is the softmax over the first len cached rows in double (and in float within a
// few ulp), refusing a length outside 1 .. M and a scratch below one row. The decoder built on them
// is tests/generate/generate.cpp's (the cached decode against the full forward).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

namespace {

constexpr int heads = 2, hd = 4;
constexpr index_t dim = heads * hd;

// att(b, h) = softmax(q·kᵀ/sqrt(hd) over j < len)·v, in double.
std::vector<double> reference_cached(const std::vector<double>& qkv, const std::vector<double>& cache, index_t batch,
                                     index_t len, index_t max_steps) {
  std::vector<double> att(static_cast<std::size_t>(batch * dim));
  for (index_t b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h) {
      std::vector<double> s(static_cast<std::size_t>(len));
      double mx = -INFINITY;
      for (index_t j = 0; j < len; ++j) {
        double d = 0;
        for (index_t c = 0; c < hd; ++c)
          d += qkv[static_cast<std::size_t>(b * 3 * dim + h * hd + c)] *
               cache[static_cast<std::size_t>((b * max_steps + j) * 2 * dim + h * hd + c)];
        s[static_cast<std::size_t>(j)] = d / std::sqrt(double(hd));
        mx = std::max(mx, s[static_cast<std::size_t>(j)]);
      }
      double sum = 0;
      for (auto& v : s) sum += (v = std::exp(v - mx));
      for (index_t c = 0; c < hd; ++c) {
        double a = 0;
        for (index_t j = 0; j < len; ++j)
          a += s[static_cast<std::size_t>(j)] / sum *
               cache[static_cast<std::size_t>((b * max_steps + j) * 2 * dim + dim + h * hd + c)];
        att[static_cast<std::size_t>(b * dim + h * hd + c)] = a;
      }
    }
  return att;
}

}  // namespace

TEST_CASE("kv_append writes each new row's k and v at its position and nothing else", "[ops][kv_cache]") {
  const index_t batch = 2, n = 3, at = 2, max_steps = 6;
  const auto qkv = random_vector(static_cast<std::size_t>(batch * n * 3 * dim), 1);
  std::vector<double> cache(static_cast<std::size_t>(batch * max_steps * 2 * dim), -7.0);
  cpu::kv_append(cache.data(), qkv.data(), batch, n, at, max_steps, dim);
  for (index_t b = 0; b < batch; ++b)
    for (index_t s = 0; s < max_steps; ++s)
      for (index_t j = 0; j < 2 * dim; ++j) {
        const double got = cache[static_cast<std::size_t>((b * max_steps + s) * 2 * dim + j)];
        INFO("example " << b << " row " << s << " column " << j);
        if (s >= at && s < at + n)
          CHECK(got == qkv[static_cast<std::size_t>((b * n + s - at) * 3 * dim + dim + j)]);
        else
          CHECK(got == -7.0);
      }
  // converted to the cache's dtype
  std::vector<etude::bf16> cache16(cache.size());
  const std::vector<float> qkvf(qkv.begin(), qkv.end());
  cpu::kv_append(cache16.data(), qkvf.data(), batch, n, at, max_steps, dim);
  CHECK(static_cast<float>(cache16[static_cast<std::size_t>(at * 2 * dim)]) ==
        static_cast<float>(etude::bf16(qkvf[static_cast<std::size_t>(dim)])));

  CHECK_THROWS_AS(cpu::kv_append(cache.data(), qkv.data(), batch, n, max_steps - n + 1, max_steps, dim), etude::error);
  CHECK_THROWS_AS(cpu::kv_append(cache.data(), qkv.data(), batch, n, -1, max_steps, dim), etude::error);
}

TEST_CASE("cached_attention is the softmax over the first len cached rows", "[ops][kv_cache]") {
  const index_t batch = 3, max_steps = 7;
  const auto qkv = random_vector(static_cast<std::size_t>(batch * 3 * dim), 2, 2.0);
  const auto cache = random_vector(static_cast<std::size_t>(batch * max_steps * 2 * dim), 3, 2.0);
  const int threads = 2;
  const index_t scratch_size = cpu::cached_attention_scratch(max_steps, heads, threads);
  CHECK(scratch_size >= max_steps);
  for (const index_t len : {index_t{1}, index_t{4}, max_steps}) {
    INFO("len " << len);
    const auto want = reference_cached(qkv, cache, batch, len, max_steps);
    std::vector<double> att(want.size()), scratch(static_cast<std::size_t>(scratch_size));
    cpu::cached_attention<hd>(att.data(), qkv.data(), cache.data(), batch, len, max_steps, heads, scratch.data(),
                              scratch_size);
    for (std::size_t i = 0; i < att.size(); ++i) CHECK(att[i] == Approx(want[i]).epsilon(1e-12).margin(1e-14));

    // float: scores, softmax and sums in float, one rounding of each output
    const std::vector<float> qf(qkv.begin(), qkv.end()), cf(cache.begin(), cache.end());
    std::vector<float> attf(want.size()), scratchf(scratch.size());
    cpu::cached_attention<hd>(attf.data(), qf.data(), cf.data(), batch, len, max_steps, heads, scratchf.data(),
                              scratch_size);
    check_close(attf, as_float(reference_cached(as_double(qf), as_double(cf), batch, len, max_steps)), 1e-5, 1e-6,
                "cached_attention in float");
  }
  std::vector<double> att(static_cast<std::size_t>(batch * dim)), scratch(static_cast<std::size_t>(scratch_size));
  CHECK_THROWS_AS(cpu::cached_attention<hd>(att.data(), qkv.data(), cache.data(), batch, 0, max_steps, heads,
                                            scratch.data(), scratch_size), etude::error);
  CHECK_THROWS_AS(cpu::cached_attention<hd>(att.data(), qkv.data(), cache.data(), batch, max_steps + 1, max_steps,
                                            heads, scratch.data(), scratch_size), etude::error);
  CHECK_THROWS_AS(cpu::cached_attention<hd>(att.data(), qkv.data(), cache.data(), batch, 2, max_steps, heads,
                                            scratch.data(), max_steps - 1), etude::error);
}
