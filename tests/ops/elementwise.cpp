// The elementwise ops, written once for every backend (the category file ETUDE_OPS_CATEGORY names
// it: tests/ops/category_cpu.hpp in test_ops, category_cuda.hpp in test_gpu_ops and test_sim_ops):
// copy's conversions and fill_zero bit for bit, the sinusoidal positions and GELU forward and
// backward in f32, bf16 and fp16 within the dtype's bound of the CPU in float on the same values. On
// the CPU only: exact-erf GELU and its backward against central differences and fp64, and the
// vectorised exp, normal density and normal tail they use, against libm.
#include ETUDE_OPS_CATEGORY

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

TEST_CASE(TEST_BACKEND_NAME ": copy converts, fill_zero zeroes, sinusoid matches AudioCraft's positions",
          "[ops][elementwise]") {
  const vec x = uniform(1001, -3, 3, 8);
  for (dtype src : {dtype::f32, dtype::bf16, dtype::f16})
    for (dtype dst : {dtype::f32, dtype::bf16, dtype::f16}) {
      const vec in = round_to(src, x);
      // conversion is exact rounding to nearest even: bit-identical to the host's conversion
      check_equal(TEST_BACKEND::convert(dst, src, in), round_to(dst, in),
                  std::string("copy ") + name(src) + "->" + name(dst));
    }
  for (dtype t : {dtype::f32, dtype::bf16}) check_equal(TEST_BACKEND::fill_zero(t, x), vec(x.size(), 0.0f), "fill_zero");
  const index_t steps = 1501, dim = 64;
  vec want(static_cast<std::size_t>(steps * dim));
  cpu::sinusoid(want.data(), steps, dim);
  // both in double, rounded once: equal unless the device's cos/sin differ by an ulp of double
  // right at a float rounding boundary
  check_close(TEST_BACKEND::sinusoid(dtype::f32, steps, dim), want, 0x1p-23, 0x1p-30, "sinusoid f32");
  check_close(TEST_BACKEND::sinusoid(dtype::bf16, steps, dim), round_to(dtype::bf16, want), 0x1p-7, 0x1p-30,
              "sinusoid bf16");
}

TEST_CASE(TEST_BACKEND_NAME ": gelu forward and backward match the CPU", "[ops][elementwise]") {
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16}) {
    const vec x = uniform(10007, -6, 6, 70, t), dy = uniform(10007, -2, 2, 71, t);
    vec y(x.size());
    cpu::gelu_fwd(y.data(), x.data(), static_cast<index_t>(x.size()));
    // erf/exp within a few ulp on each side (CUDA's erff: 2 ulp; the CPU's: 3 ulp), then one rounding
    check_close(TEST_BACKEND::gelu_fwd(t, x), y, unit_roundoff(t) + 2e-6, 1e-7, std::string("gelu_fwd ") + name(t));
    vec dx = dy;
    cpu::gelu_bwd(dx.data(), x.data(), static_cast<index_t>(x.size()));
    check_close(TEST_BACKEND::gelu_bwd(t, dy, x), dx, unit_roundoff(t) + 2e-6, 1e-7,
                std::string("gelu_bwd ") + name(t));
  }
}

// Dropout's definition element by element (ops/dropout.hpp), bit for bit in every dtype: a kept
// element is x·scale in float rounded once, a dropped one 0; += adds that in float and rounds once.
// Strided rows, a row offset, and the mask's statistics: about 1 − p kept, every row and column
// reached, and another site, step or row offset another mask.
TEST_CASE(TEST_BACKEND_NAME ": dropout keeps the counter-based mask's elements, scaled", "[ops][elementwise][dropout]") {
  const index_t rows = 97, cols = 70, ldx = 75, ldy = 72;
  const double p = 0.3;
  const auto key = etude::ops::dropout_key(p, 42, 7);
  const std::uint64_t site = etude::ops::dropout_site(4, 1, -1);
  const index_t row0 = 1234;
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16}) {
    const vec x = uniform(static_cast<std::size_t>(rows * ldx), -2, 2, 81, t);
    const vec y0 = uniform(static_cast<std::size_t>(rows * ldy), -1, 1, 82, t);
    for (const bool accumulate : {false, true}) {
      vec want = y0;
      index_t kept = 0;
      for (index_t r = 0; r < rows; ++r)
        for (index_t j = 0; j < cols; ++j) {
          const bool keep = etude::ops::dropout_keeps(key, site, row0 + r, j);
          kept += keep ? 1 : 0;
          const float v = keep ? x[static_cast<std::size_t>(r * ldx + j)] * static_cast<float>(key.scale) : 0.0f;
          float& w = want[static_cast<std::size_t>(r * ldy + j)];
          w = round_to(t, accumulate ? w + v : v);
        }
      vec got = y0;
      TEST_BACKEND::dropout(t, got, ldy, x, ldx, rows, cols, key, site, row0, accumulate);
      check_equal(got, want, std::string("dropout ") + name(t) + (accumulate ? " +=" : " ="));
      // about 1 − p kept: within five standard deviations
      const double n = static_cast<double>(rows * cols), sd = std::sqrt(n * p * (1 - p));
      CHECK(std::abs(static_cast<double>(kept) - n * (1 - p)) < 5 * sd);
    }
  }
  CHECK(key.scale == 1.0 / 0.7);
  // every row and every column keeps some and drops some; other sites, steps and rows differ
  auto mask = [&](const etude::ops::dropout_scalars& k, std::uint64_t s, index_t r0) {
    std::vector<char> m(static_cast<std::size_t>(rows * cols));
    for (index_t r = 0; r < rows; ++r)
      for (index_t j = 0; j < cols; ++j) m[static_cast<std::size_t>(r * cols + j)] = etude::ops::dropout_keeps(k, s, r0 + r, j);
    return m;
  };
  const auto m = mask(key, site, row0);
  for (index_t r = 0; r < rows; ++r) {
    index_t in_row = 0;
    for (index_t j = 0; j < cols; ++j) in_row += m[static_cast<std::size_t>(r * cols + j)];
    CHECK((in_row > 0 && in_row < cols));
  }
  for (index_t j = 0; j < cols; ++j) {
    index_t in_col = 0;
    for (index_t r = 0; r < rows; ++r) in_col += m[static_cast<std::size_t>(r * cols + j)];
    CHECK((in_col > 0 && in_col < rows));
  }
  auto agreement = [&](const std::vector<char>& o) {
    index_t same = 0;
    for (std::size_t i = 0; i < m.size(); ++i) same += m[i] == o[i] ? 1 : 0;
    return static_cast<double>(same) / static_cast<double>(m.size());
  };
  // independent masks agree on p² + (1 − p)² = 0.58 of the elements
  CHECK(agreement(mask(key, etude::ops::dropout_site(4, 0, -1), row0)) < 0.65);
  CHECK(agreement(mask(etude::ops::dropout_key(p, 42, 8), site, row0)) < 0.65);
  CHECK(agreement(mask(etude::ops::dropout_key(p, 43, 7), site, row0)) < 0.65);
  CHECK(agreement(mask(key, site, row0 + 1)) < 0.65);
  CHECK(agreement(mask(key, site, row0)) == 1.0);
  // p = 0 keeps everything, unscaled
  const auto none = etude::ops::dropout_key(0.0, 42, 7);
  CHECK(none.threshold == 0);
  CHECK(none.scale == 1.0);
}

#ifdef TEST_BACKEND_CPU

// A run of stream_bytes or more is zeroed by streaming stores (elementwise.hpp): every element of
// runs that start off a 64-byte line and end inside one, and nothing on either side.
TEST_CASE("a long run is zeroed by streaming stores, every element and nothing past it", "[ops][elementwise]") {
  constexpr index_t stream_bytes = etude::backend::cpu_tuning<etude::backend::cpu_op::loops>::stream_bytes;
  {
    const index_t n = stream_bytes / 4 + 7;
    std::vector<float> x(static_cast<std::size_t>(n + 16), 1.5f);
    cpu::fill_zero(x.data() + 3, n);  // 12 bytes past wherever the vector starts
    CHECK(x[0] == 1.5f);
    CHECK(x[2] == 1.5f);
    CHECK(std::all_of(x.begin() + 3, x.begin() + 3 + n, [](float v) { return std::bit_cast<std::uint32_t>(v) == 0u; }));
    CHECK(x[static_cast<std::size_t>(n + 3)] == 1.5f);
    CHECK(x.back() == 1.5f);
  }
  {
    const index_t n = stream_bytes / 2 + 33;
    std::vector<etude::bf16> x(static_cast<std::size_t>(n + 4), etude::bf16(2.0f));
    cpu::fill_zero(x.data() + 1, n);
    CHECK(x[0].bits == etude::bf16(2.0f).bits);
    CHECK(std::all_of(x.begin() + 1, x.begin() + 1 + n, [](etude::bf16 v) { return v.bits == 0; }));
    CHECK(x[static_cast<std::size_t>(n + 1)].bits == etude::bf16(2.0f).bits);
  }
}

TEST_CASE("GELU backward matches central differences", "[ops]") {
  auto x = random_vector(40, 8, 4.0);
  const auto dy = random_vector(40, 9);
  std::vector<double> y(40);
  auto loss = [&] {
    cpu::gelu_fwd(y.data(), x.data(), 40);
    return dot(y, dy);
  };
  std::vector<double> dx = dy;
  cpu::gelu_bwd(dx.data(), x.data(), 40);
  check_gradient(x, dx, loss, "dx");
  // exact erf GELU, not the tanh approximation
  const double v = 1.5;
  double out;
  cpu::gelu_fwd(&out, &v, 1);
  CHECK(out == Approx(0.5 * 1.5 * (1 + std::erf(1.5 / std::sqrt(2.0)))).epsilon(1e-15));
}

TEST_CASE("vectorised exp is within 2 ulp of libm", "[ops]") {
  for (float x = -87.0f; x <= 88.0f; x += 0.001953125f) {
    const float ours = etude::backend::cpu_detail::exp_cody_waite(x);
    const double ref = std::exp(static_cast<double>(x));
    INFO("x = " << x);
    REQUIRE(std::abs(ours - ref) <= 2.5 * std::abs(ref) * 5.96e-8);
  }
  CHECK(etude::backend::cpu_detail::exp_cody_waite(-110.0f) == 0.0f);
  // subnormal results keep their magnitude
  CHECK(etude::backend::cpu_detail::exp_cody_waite(-95.0f) == Approx(std::exp(-95.0)).epsilon(1e-3));
  CHECK(std::isinf(etude::backend::cpu_detail::exp_cody_waite(100.0f)));
  CHECK(etude::backend::cpu_detail::exp_cody_waite(0.0f) == 1.0f);
  CHECK(std::isnan(etude::backend::cpu_detail::exp_cody_waite(std::nanf(""))));
}

TEST_CASE("vectorised normal density and tail are within a few ulp of libm", "[ops]") {
  namespace d = etude::backend::cpu_detail;
  const auto ulp = [](double v) {
    const float f = std::abs(static_cast<float>(v));
    return static_cast<double>(std::nextafter(f, INFINITY) - f);
  };
  double worst_gauss = 0.0, worst_tail = 0.0;
  for (float x = -13.25f; x <= 13.25f; x += 0x1p-13f) {
    const double v = x, g = std::exp(-0.5 * v * v), q = 0.5 * std::erfc(std::abs(v) / std::sqrt(2.0));
    const float ours = d::gauss(x), tail = d::normal_tail(x, ours);
    INFO("x = " << x);
    if (g >= 0x1p-124) {
      worst_gauss = std::max(worst_gauss, std::abs(ours - g) / ulp(g));
      worst_tail = std::max(worst_tail, std::abs(tail - q) / ulp(q));
    } else {  // below 2^-124: flushed or right, never a wrong magnitude
      REQUIRE((ours == 0.0f || std::abs(ours - g) <= 1.5 * ulp(g)));
      REQUIRE((tail == 0.0f || std::abs(tail - q) <= 7.0 * ulp(q)));
    }
  }
  INFO("gauss " << worst_gauss << " ulp, tail " << worst_tail << " ulp");
  CHECK(worst_gauss <= 1.5);
  CHECK(worst_tail <= 7.0);
  CHECK(d::gauss(0.0f) == 1.0f);
  CHECK(d::gauss(INFINITY) == 0.0f);
  CHECK(d::gauss(-1e30f) == 0.0f);
  CHECK(d::normal_cdf(0.0f, 1.0f) == 0.5f);
  CHECK(d::normal_cdf(INFINITY, d::gauss(INFINITY)) == 1.0f);
  CHECK(d::normal_cdf(-INFINITY, d::gauss(-INFINITY)) == 0.0f);
}

TEST_CASE("GELU forward is x·Φ(x) within a few roundings, also where Φ is small", "[ops]") {
  // 0.5·x·(1 + erf(x/√2)) loses Φ's relative accuracy below x = -1 (x = -5: every digit); the
  // forward takes Φ from the tail instead
  std::vector<float> x;
  for (float v = -13.0f; v <= 13.0f; v += 0x1p-10f) x.push_back(v);
  std::vector<float> y(x.size());
  cpu::gelu_fwd(y.data(), x.data(), index_t(x.size()));
  std::vector<etude::bf16> xb(x.size()), yb(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xb[i] = etude::bf16(x[i]);
  cpu::gelu_fwd(yb.data(), xb.data(), index_t(x.size()));
  const auto exact = [](double v) { return v * 0.5 * std::erfc(-v / std::sqrt(2.0)); };
  double worst = 0.0, worst_bf16 = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = exact(x[i]);
    if (std::abs(want) < 0x1p-120) continue;  // x·Φ(x) within reach of the flush to zero
    worst = std::max(worst, std::abs(y[i] - want) / (std::abs(want) * 0x1p-24));
    // bf16: one rounding of the float result (half a bf16 ulp, 2^-8 relative at most) plus float work
    const double want_b = exact(static_cast<float>(xb[i])), got_b = static_cast<float>(yb[i]);
    worst_bf16 = std::max(worst_bf16, std::abs(got_b - want_b) / (std::abs(want_b) * (0x1p-8 + 16 * 0x1p-24)));
  }
  INFO("float: " << worst << " roundings of x·Φ(x); bf16: " << worst_bf16 << " of its bound");
  CHECK(worst <= 8.0);
  CHECK(worst_bf16 <= 1.0);
}

TEST_CASE("GELU backward in float is the exact derivative within a few roundings", "[ops]") {
  // float and bf16 inputs over the range a step sees, against the derivative in double
  std::vector<float> x, dy;
  for (float v = -7.0f; v <= 7.0f; v += 0.0009765625f) {
    x.push_back(v);
    dy.push_back(1.0f - v / 16.0f);
  }
  std::vector<float> dx = dy;
  cpu::gelu_bwd(dx.data(), x.data(), index_t(x.size()));
  std::vector<etude::bf16> xb(x.size()), dxb(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    xb[i] = etude::bf16(x[i]);
    dxb[i] = etude::bf16(dy[i]);
  }
  cpu::gelu_bwd(dxb.data(), xb.data(), index_t(x.size()));
  double worst = 0.0, worst_bf16 = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto derivative = [](double v) {
      return 0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) + v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
    };
    const double v = x[i], vb = static_cast<float>(xb[i]);
    // the two terms' magnitudes bound the rounding: cdf and |x|·pdf, each within a few float ulp
    const double scale = std::abs(dy[i]) * (1.0 + std::abs(v) * std::exp(-0.5 * v * v));
    worst = std::max(worst, std::abs(dx[i] - dy[i] * derivative(v)) / (scale * 0x1p-24));
    const double got = static_cast<float>(dxb[i]), want = static_cast<float>(etude::bf16(dy[i])) * derivative(vb);
    worst_bf16 = std::max(worst_bf16, std::abs(got - want) / (std::abs(want) * 0x1p-8 + scale * 0x1p-22));
  }
  INFO("float: " << worst << " float roundings; bf16: " << worst_bf16 << " of its bound");
  CHECK(worst <= 16.0);
  CHECK(worst_bf16 <= 1.0);
}

// 16-bit activations take GELU and its slope from tables of all 65536 inputs: the float
// computation rounded to the input's type, bit for bit, for every input (NaNs, infinities and
// subnormals too), with float or 16-bit gradients, and on lengths that end inside a vector.
template <class T>
void check_gelu_table() {
  constexpr index_t codes = index_t{1} << 16;
  std::vector<T> x(codes), y(codes), dy(codes);
  std::vector<float> xf(codes), yf(codes), dyf(codes), dxf(codes);
  std::uint32_t state = 12345;
  for (index_t i = 0; i < codes; ++i) {
    x[i] = T::from_bits(static_cast<std::uint16_t>(i));
    xf[i] = static_cast<float>(x[i]);
    state = state * 1664525u + 1013904223u;  // gradients over many binades, both signs
    dy[i] = T(std::ldexp(1.0f + static_cast<float>(state >> 9) * 0x1p-23f, static_cast<int>(state % 40) - 24) *
              ((state >> 8) % 2 != 0 ? -1.0f : 1.0f));
    dyf[i] = static_cast<float>(dy[i]);
  }
  cpu::gelu_fwd(yf.data(), xf.data(), codes);
  cpu::gelu_fwd(y.data(), x.data(), codes);
  dxf = dyf;
  cpu::gelu_bwd(dxf.data(), xf.data(), codes);
  std::vector<float> dx_wide = dyf;  // float gradients of 16-bit inputs
  cpu::gelu_bwd(dx_wide.data(), x.data(), codes);
  std::vector<T> dx = dy;
  cpu::gelu_bwd(dx.data() + 3, x.data() + 3, codes - 10);  // starts and ends inside a vector
  index_t forward = 0, backward = 0, wide = 0, untouched = 0;
  for (index_t i = 0; i < codes; ++i) {
    forward += y[i].bits != T(yf[i]).bits;
    wide += std::bit_cast<std::uint32_t>(dx_wide[i]) != std::bit_cast<std::uint32_t>(dxf[i]);
    if (i < 3 || i >= codes - 7) untouched += dx[i].bits != dy[i].bits;
    else backward += dx[i].bits != T(dxf[i]).bits;
  }
  CHECK(forward == 0);
  CHECK(backward == 0);
  CHECK(wide == 0);
  CHECK(untouched == 0);
}

TEST_CASE("GELU of bf16 and fp16 activations is the float GELU rounded, for every input", "[ops]") {
  check_gelu_table<etude::bf16>();
  check_gelu_table<etude::fp16>();
}

#endif  // TEST_BACKEND_CPU
