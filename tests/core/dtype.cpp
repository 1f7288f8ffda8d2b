// bf16 and fp16: every 16-bit pattern widens exactly and narrows back to itself; narrowing from
// float agrees with independent references (GCC's _Float16 for fp16, nearest-by-distance in double
// for bf16) over a sampled sweep of the float bit patterns by default and over all 2^32 of them in
// the hidden [.exhaustive] cases; narrowing from double rounds once; hand-picked ties, overflow,
// underflow, signed zeros and NaNs; PyTorch (torch.bfloat16, torch.float16) on ~2000 values; the
// array conversion against the scalar one for lengths around the vector width.
#include <catch2/catch.hpp>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <etude/core/dtype.hpp>

using etude::bf16;
using etude::fp16;
using etude::index_t;

namespace {

float f_of(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t u_of(float f) { return std::bit_cast<std::uint32_t>(f); }

std::string hex(std::uint64_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// Deterministic, position-addressable random numbers (splitmix64), so that parallel sweeps are
// reproducible whatever the thread count.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15u;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
  return x ^ (x >> 31);
}

// ---- independent references ---------------------------------------------------------------------

// The value of a 16-bit pattern with `frac` fraction bits and 15 - frac exponent bits, by ldexp.
double decode(std::uint16_t h, int frac) {
  const int exp_bits = 15 - frac;
  const int bias = (1 << (exp_bits - 1)) - 1;
  const unsigned e = (h >> frac) & ((1u << exp_bits) - 1);
  const unsigned m = h & ((1u << frac) - 1);
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  if (e == (1u << exp_bits) - 1) return m ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  if (e == 0) return sign * std::ldexp(m, 1 - bias - frac);
  return sign * std::ldexp(m + (1u << frac), static_cast<int>(e) - bias - frac);
}
double decode(bf16 b) { return decode(b.bits, 7); }
double decode(fp16 h) { return decode(h.bits, 10); }

// The nearest value of a binary format with p significant bits, normals down to 2^emin and largest
// finite value maxf, to x: the two grid points around |x| and their distances, ties to the even
// one, in double arithmetic (exact here: x/q scales by a power of two). Overflow gives ±inf.
double nearest(double x, int p, int emin, double maxf) {
  if (std::isnan(x) || std::isinf(x)) return x;
  const double a = std::fabs(x);
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  const double q = std::ldexp(1.0, std::max(e - 1, emin) - (p - 1));
  const double lo = std::floor(a / q) * q, hi = lo + q;
  const double dlo = a - lo, dhi = hi - a;
  double r = dlo < dhi ? lo : dhi < dlo ? hi : (std::fmod(lo / q, 2.0) == 0.0 ? lo : hi);
  if (r > maxf) r = HUGE_VAL;
  return std::copysign(r, x);
}
double nearest_bf16(double x) { return nearest(x, 8, -126, etude::dtype_traits<bf16>::max_finite); }
double nearest_fp16(double x) { return nearest(x, 11, -14, etude::dtype_traits<fp16>::max_finite); }

// bf16 of a float, by a different route: the neighbours below and above in magnitude are the
// float truncated to its top half and that plus one unit (2^128 past the largest finite), and the
// nearer one wins, the even one on a tie. Distances in double are exact.
std::uint16_t bf16_by_distance(float f) {
  const std::uint32_t u = u_of(f);
  if (std::isinf(f)) return static_cast<std::uint16_t>(u >> 16);
  const std::uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  const double x = f, vlo = f_of(lo);
  const double vhi = (hi & 0x7fffffffu) == 0x7f800000u ? std::copysign(0x1p128, x) : double(f_of(hi));
  const double dlo = std::fabs(x - vlo), dhi = std::fabs(vhi - x);
  const std::uint32_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (((lo >> 16) & 1u) ? hi : lo);
  return static_cast<std::uint16_t>(pick >> 16);
}

// The narrowing rule for a NaN: NaN, same sign, quiet bit set, top payload bits kept.
bool nan_rule_bf16(float f, std::uint16_t got) { return got == ((u_of(f) >> 16) | 0x0040u); }
bool nan_rule_fp16(float f, std::uint16_t got) {
  const std::uint32_t u = u_of(f);
  return got == (((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu));
}

bool matches_reference_bf16(std::uint32_t u) {
  const float f = f_of(u);
  const std::uint16_t got = bf16(f).bits;
  return std::isnan(f) ? nan_rule_bf16(f, got) : got == bf16_by_distance(f);
}

#if defined(__FLT16_MAX__)
// GCC's float -> _Float16 conversion (correctly rounded, to nearest even by default). Without F16C
// it is libgcc's soft-float routine at ~100 ns a value; where the CPU has F16C the same source
// compiled for it is one vcvtps2ph, which makes a sweep of 10^8 values take a second.
std::uint16_t float16_soft(float f) { return std::bit_cast<std::uint16_t>(static_cast<_Float16>(f)); }
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("f16c"))) std::uint16_t float16_f16c(float f) {
  return std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
}
const bool have_f16c = __builtin_cpu_supports("f16c") != 0;
std::uint16_t float16(float f) { return have_f16c ? float16_f16c(f) : float16_soft(f); }
#else
std::uint16_t float16(float f) { return float16_soft(f); }
#endif

bool matches_float16(std::uint32_t u) {
  const float f = f_of(u);
  const std::uint16_t got = fp16(f).bits;
  const std::uint16_t want = float16(f);
  if (std::isnan(f))
    return nan_rule_fp16(f, got) && (want & 0x7c00u) == 0x7c00u && (want & 0x3ffu) != 0 &&
           (want & 0x8000u) == (got & 0x8000u);
  return got == want;
}
#endif

// ---- parallel sweeps ----------------------------------------------------------------------------

struct sweep_result {
  std::uint64_t checked = 0;
  std::uint64_t failed = 0;
  std::vector<std::uint32_t> examples;  // the first few failing float bit patterns
};

// ok(pattern(i)) for i in [0, count), over the OpenMP team.
template <class Pattern, class Ok>
sweep_result sweep(std::uint64_t count, Pattern pattern, Ok ok) {
  sweep_result r;
  r.checked = count;
  std::uint64_t failed = 0;
  std::mutex m;
  const auto n = static_cast<std::int64_t>(count);
#pragma omp parallel for schedule(static, 1 << 16) reduction(+ : failed)
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t u = pattern(static_cast<std::uint64_t>(i));
    if (!ok(u)) {
      ++failed;
      std::lock_guard<std::mutex> lock(m);
      if (r.examples.size() < 8) r.examples.push_back(u);
    }
  }
  r.failed = failed;
  return r;
}

std::string describe(const sweep_result& r) {
  std::string s = std::to_string(r.failed) + " of " + std::to_string(r.checked) + " float patterns disagree";
  for (auto u : r.examples)
    s += "\n  input " + hex(u) + " -> bf16 " + hex(bf16(f_of(u)).bits) + ", fp16 " + hex(fp16(f_of(u)).bits);
  return s;
}

// The default sweep: every pattern of the top 24 bits with the low 8 bits at 0, 1, 0x7f, 0x80, 0x81
// and 0xff (every exponent and leading fraction, with the bits below just at, above and below the
// rounding points of both formats), then uniformly random patterns.
constexpr std::uint32_t low_bytes[] = {0x00, 0x01, 0x7f, 0x80, 0x81, 0xff};
constexpr std::uint64_t structured_count = (std::uint64_t{1} << 24) * 6;
constexpr std::uint64_t random_count = 10'000'000;
std::uint32_t structured(std::uint64_t i) { return static_cast<std::uint32_t>(i / 6) << 8 | low_bytes[i % 6]; }
std::uint32_t random_pattern(std::uint64_t i) { return static_cast<std::uint32_t>(mix(i ^ 0x5eed) >> 32); }
std::uint32_t every(std::uint64_t i) { return static_cast<std::uint32_t>(i); }

// ---- compile time -------------------------------------------------------------------------------

static_assert(bf16(1.0f).bits == 0x3f80);
static_assert(fp16(1.0f).bits == 0x3c00);
static_assert(fp16(65520.0f).bits == 0x7c00);
static_assert(fp16(0x1p-25f).bits == 0x0000 && fp16(0x1.000002p-25f).bits == 0x0001);
static_assert(static_cast<float>(fp16::from_bits(0x0001)) == 0x1p-24f);
static_assert(static_cast<float>(bf16::from_bits(0x0001)) == 0x1p-133f);
static_assert(etude::convert<bf16>(1.0 + 0x1p-8 + 0x1p-30).bits == 0x3f81);
static_assert(etude::convert<bf16>(static_cast<float>(1.0 + 0x1p-8 + 0x1p-30)).bits == 0x3f80);
static_assert(etude::convert<double>(fp16::from_bits(0x7bff)) == 65504.0);
static_assert(etude::is_reduced_precision_v<bf16> && etude::is_reduced_precision_v<fp16>);
static_assert(!etude::is_reduced_precision_v<float> && !etude::is_reduced_precision_v<double>);
static_assert(etude::floating_dtype<bf16> && !etude::floating_dtype<int> && !etude::floating_dtype<long double>);

}  // namespace

TEST_CASE("dtype: traits", "[dtype]") {
  using etude::dtype_traits;
  CHECK(dtype_traits<float>::name == "f32");
  CHECK(dtype_traits<double>::name == "f64");
  CHECK(dtype_traits<bf16>::name == "bf16");
  CHECK(dtype_traits<fp16>::name == "f16");
  CHECK(dtype_traits<float>::safetensors_name == "F32");
  CHECK(dtype_traits<double>::safetensors_name == "F64");
  CHECK(dtype_traits<bf16>::safetensors_name == "BF16");
  CHECK(dtype_traits<fp16>::safetensors_name == "F16");
  CHECK(dtype_traits<float>::bytes == sizeof(float));
  CHECK(dtype_traits<double>::bytes == sizeof(double));
  CHECK(dtype_traits<bf16>::bytes == 2);
  CHECK(dtype_traits<fp16>::bytes == 2);

  CHECK(dtype_traits<float>::max_finite == std::numeric_limits<float>::max());
  CHECK(dtype_traits<float>::min_normal == std::numeric_limits<float>::min());
  CHECK(dtype_traits<float>::unit_roundoff == std::numeric_limits<float>::epsilon() / 2);
  CHECK(dtype_traits<double>::max_finite == std::numeric_limits<double>::max());
  CHECK(dtype_traits<double>::min_normal == std::numeric_limits<double>::min());
  CHECK(dtype_traits<double>::unit_roundoff == std::numeric_limits<double>::epsilon() / 2);

  // The 16-bit constants against the encodings: largest finite, smallest normal, and 1 + 2u as
  // the successor of 1 (1 + u is the tie between them, and rounds back to 1).
  CHECK(decode(bf16::from_bits(0x7f7f)) == dtype_traits<bf16>::max_finite);
  CHECK(decode(bf16::from_bits(0x0080)) == dtype_traits<bf16>::min_normal);
  CHECK(decode(bf16::from_bits(0x3f81)) == 1 + 2 * dtype_traits<bf16>::unit_roundoff);
  CHECK(etude::convert<bf16>(1 + dtype_traits<bf16>::unit_roundoff).bits == 0x3f80);
  CHECK(decode(fp16::from_bits(0x7bff)) == dtype_traits<fp16>::max_finite);
  CHECK(decode(fp16::from_bits(0x0400)) == dtype_traits<fp16>::min_normal);
  CHECK(decode(fp16::from_bits(0x3c01)) == 1 + 2 * dtype_traits<fp16>::unit_roundoff);
  CHECK(etude::convert<fp16>(1 + dtype_traits<fp16>::unit_roundoff).bits == 0x3c00);
  CHECK(dtype_traits<bf16>::digits == 8);
  CHECK(dtype_traits<fp16>::digits == 11);
}

TEST_CASE("dtype: every bf16 and fp16 pattern widens exactly and narrows back to itself", "[dtype]") {
  // Widening: the float equals the pattern's value decoded by ldexp (sign of zero included) and
  // double agrees. Narrowing that float again gives the same pattern, except that a signalling NaN
  // comes back quiet: the pattern with its quiet bit set (same sign, same payload otherwise).
  int bad_bf16 = 0, bad_fp16 = 0;
  std::vector<std::string> notes;
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    {
      const bf16 x = bf16::from_bits(bits);
      const float f = static_cast<float>(x);
      const double want = decode(x);
      const bool nan = std::isnan(want);
      const bool value_ok = nan ? std::isnan(f) && std::signbit(f) == ((bits & 0x8000u) != 0)
                                : double(f) == want && std::signbit(f) == std::signbit(want);
      const bool double_ok = nan ? std::isnan(etude::convert<double>(x)) : etude::convert<double>(x) == want;
      const std::uint16_t back = bf16(f).bits, back_d = etude::convert<bf16>(etude::convert<double>(x)).bits;
      const std::uint16_t expect = nan ? static_cast<std::uint16_t>(bits | 0x0040u) : bits;
      if (!value_ok || !double_ok || back != expect || (!nan && back_d != bits)) {
        if (++bad_bf16 <= 4) notes.push_back("bf16 " + hex(bits) + " -> " + std::to_string(f) + " -> " + hex(back));
      }
    }
    {
      const fp16 x = fp16::from_bits(bits);
      const float f = static_cast<float>(x);
      const double want = decode(x);
      const bool nan = std::isnan(want);
      const bool value_ok = nan ? std::isnan(f) && std::signbit(f) == ((bits & 0x8000u) != 0)
                                : double(f) == want && std::signbit(f) == std::signbit(want);
      const bool double_ok = nan ? std::isnan(etude::convert<double>(x)) : etude::convert<double>(x) == want;
      const std::uint16_t back = fp16(f).bits, back_d = etude::convert<fp16>(etude::convert<double>(x)).bits;
      const std::uint16_t expect = nan ? static_cast<std::uint16_t>(bits | 0x0200u) : bits;
      if (!value_ok || !double_ok || back != expect || (!nan && back_d != bits)) {
        if (++bad_fp16 <= 4) notes.push_back("fp16 " + hex(bits) + " -> " + std::to_string(f) + " -> " + hex(back));
      }
    }
  }
  std::string all;
  for (const auto& n : notes) all += n + "\n";
  INFO(all);
  CHECK(bad_bf16 == 0);
  CHECK(bad_fp16 == 0);
}

TEST_CASE("dtype: one format to the other rounds like the reference", "[dtype]") {
  // fp16 -> bf16 rounds (11 to 8 bits); bf16 -> fp16 rounds, overflows and underflows.
  int bad = 0;
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const double h = decode(fp16::from_bits(bits)), g = decode(bf16::from_bits(bits));
    const bf16 hb = etude::convert<bf16>(fp16::from_bits(bits));
    const fp16 gh = etude::convert<fp16>(bf16::from_bits(bits));
    const double want_hb = nearest_bf16(h), want_gh = nearest_fp16(g);
    const bool ok_hb =
        std::isnan(h) ? std::isnan(decode(hb)) : decode(hb) == want_hb && std::signbit(decode(hb)) == std::signbit(h);
    const bool ok_gh =
        std::isnan(g) ? std::isnan(decode(gh)) : decode(gh) == want_gh && std::signbit(decode(gh)) == std::signbit(g);
    if (!ok_hb || !ok_gh) {
      ++bad;
      UNSCOPED_INFO("pattern " << hex(bits) << ": fp16->bf16 " << hex(hb.bits) << ", bf16->fp16 " << hex(gh.bits));
      if (bad > 4) break;
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("dtype: ties, overflow, underflow, signed zeros and NaN, by hand", "[dtype]") {
  struct row {
    std::uint32_t in;
    std::uint16_t want;
    const char* what;
  };
  const row bf16_rows[] = {
      {0x3f800000, 0x3f80, "1"},
      {0x3f808000, 0x3f80, "1 + 2^-8: tie, down to the even 1"},
      {0x3f818000, 0x3f82, "1 + 3·2^-8: tie, up to the even 1 + 2^-6"},
      {0x3f807fff, 0x3f80, "just below the tie"},
      {0x3f808001, 0x3f81, "just above the tie"},
      {0xbf818000, 0xbf82, "negative tie, away from zero to the even one"},
      {0x7f7f0000, 0x7f7f, "largest finite"},
      {0x7f7f7fff, 0x7f7f, "just below the midpoint to 2^128"},
      {0x7f7f8000, 0x7f80, "the midpoint between the largest finite and 2^128: infinity"},
      {0x7f7fffff, 0x7f80, "FLT_MAX: infinity"},
      {0xff7f8000, 0xff80, "negative midpoint: -infinity"},
      {0x7f800000, 0x7f80, "infinity"},
      {0xff800000, 0xff80, "-infinity"},
      {0x00010000, 0x0001, "smallest subnormal, 2^-133"},
      {0x00008000, 0x0000, "half the smallest subnormal: tie, to zero"},
      {0x00008001, 0x0001, "just above half the smallest subnormal"},
      {0x80008000, 0x8000, "negative half the smallest subnormal: -0"},
      {0x00000001, 0x0000, "smallest float subnormal"},
      {0x007fc000, 0x0080, "largest subnormal + half: tie, up to the smallest normal"},
      {0x00000000, 0x0000, "+0"},
      {0x80000000, 0x8000, "-0 keeps its sign"},
      {0x7fc00000, 0x7fc0, "quiet NaN"},
      {0xffc00000, 0xffc0, "negative quiet NaN"},
      {0x7f800001, 0x7fc0, "signalling NaN with payload only in the dropped half: NaN, not infinity"},
      {0x7fffffff, 0x7fff, "NaN with every bit set: no carry into the sign"},
      {0xffffffff, 0xffff, "negative NaN with every bit set"},
  };
  for (const auto& r : bf16_rows) {
    INFO(r.what << ": " << hex(r.in));
    CHECK(hex(bf16(f_of(r.in)).bits) == hex(r.want));
    CHECK(hex(etude::convert<bf16>(double(f_of(r.in))).bits) == hex(r.want));
  }
  const row fp16_rows[] = {
      {0x3f800000, 0x3c00, "1"},
      {0x3f801000, 0x3c00, "1 + 2^-11: tie, down to the even 1"},
      {0x3f803000, 0x3c02, "1 + 3·2^-11: tie, up to the even 1 + 2^-9"},
      {0x3f800fff, 0x3c00, "just below the tie"},
      {0x3f801001, 0x3c01, "just above the tie"},
      {0x477fe000, 0x7bff, "65504, the largest finite"},
      {0x477fefff, 0x7bff, "just below 65520"},
      {0x477ff000, 0x7c00, "65520, the midpoint to 2^16: infinity"},
      {0x47800000, 0x7c00, "65536"},
      {0xc77ff000, 0xfc00, "-65520: -infinity"},
      {0x7f7fffff, 0x7c00, "FLT_MAX"},
      {0x7f800000, 0x7c00, "infinity"},
      {0x38800000, 0x0400, "2^-14, the smallest normal"},
      {0x33800000, 0x0001, "2^-24, the smallest subnormal"},
      {0x33000000, 0x0000, "2^-25, half the smallest subnormal: tie, to zero"},
      {0x33000001, 0x0001, "just above 2^-25"},
      {0xb3000000, 0x8000, "-2^-25: -0"},
      {0x32800000, 0x0000, "2^-26"},
      {0x33c00000, 0x0002, "1.5·2^-24: tie, up to the even 2"},
      {0x34200000, 0x0002, "2.5·2^-24: tie, down to the even 2"},
      {0x34600000, 0x0004, "3.5·2^-24: tie, up to the even 4"},
      {0x387fc000, 0x03ff, "1023·2^-24, the largest subnormal"},
      {0x387fe000, 0x0400, "1023.5·2^-24: tie, up to the smallest normal"},
      {0x387fdfff, 0x03ff, "just below that tie"},
      {0x00000001, 0x0000, "smallest float subnormal"},
      {0x80000001, 0x8000, "negative smallest float subnormal: -0"},
      {0x80000000, 0x8000, "-0 keeps its sign"},
      {0x7fc00000, 0x7e00, "quiet NaN"},
      {0xffc00000, 0xfe00, "negative quiet NaN"},
      {0x7f800001, 0x7e00, "signalling NaN with payload only in the dropped bits: NaN, not infinity"},
      {0x7fffffff, 0x7fff, "NaN with every bit set"},
      {0xffffffff, 0xffff, "negative NaN with every bit set"},
  };
  for (const auto& r : fp16_rows) {
    INFO(r.what << ": " << hex(r.in));
    CHECK(hex(fp16(f_of(r.in)).bits) == hex(r.want));
    CHECK(hex(etude::convert<fp16>(double(f_of(r.in))).bits) == hex(r.want));
  }
}

TEST_CASE("dtype: narrowing a double rounds once", "[dtype]") {
  SECTION("the double-rounding trap, by hand") {
    // Through the nearest float these become exact ties and round to even: the wrong neighbour.
    CHECK(etude::convert<bf16>(1.0 + 0x1p-8 + 0x1p-30).bits == 0x3f81);
    CHECK(bf16(static_cast<float>(1.0 + 0x1p-8 + 0x1p-30)).bits == 0x3f80);
    CHECK(etude::convert<fp16>(1.0 + 0x1p-11 + 0x1p-40).bits == 0x3c01);
    CHECK(fp16(static_cast<float>(1.0 + 0x1p-11 + 0x1p-40)).bits == 0x3c00);
    CHECK(etude::convert<fp16>(0x1p-25 + 0x1p-60).bits == 0x0001);
    CHECK(etude::convert<fp16>(0x1p-25).bits == 0x0000);
    CHECK(etude::convert<fp16>(65520.0 - 0x1p-30).bits == 0x7bff);
    CHECK(etude::convert<bf16>(0x1p-134 + 0x1p-160).bits == 0x0001);  // below the float subnormals' grid
    CHECK(etude::convert<bf16>(0x1p-134).bits == 0x0000);
    CHECK(etude::convert<bf16>(-0x1p-134 - 0x1p-170).bits == 0x8001);
    CHECK(etude::convert<bf16>(1e300).bits == 0x7f80);
    CHECK(etude::convert<bf16>(-1e300).bits == 0xff80);
    CHECK(etude::convert<fp16>(1e300).bits == 0x7c00);
    CHECK(etude::convert<bf16>(1e-300).bits == 0x0000);
    CHECK(etude::convert<fp16>(-1e-300).bits == 0x8000);
    CHECK(etude::convert<bf16>(0x1.fep127 + 0x1p119).bits == 0x7f80);  // the overflow midpoint, beyond float
    CHECK(etude::convert<bf16>(0x1.fep127 + 0x1p119 - 0x1p80).bits == 0x7f7f);
    CHECK(etude::convert<bf16>(HUGE_VAL).bits == 0x7f80);
    CHECK(etude::convert<fp16>(-HUGE_VAL).bits == 0xfc00);
    CHECK(std::isnan(static_cast<float>(etude::convert<bf16>(std::numeric_limits<double>::quiet_NaN()))));
    CHECK(etude::convert<fp16>(-std::numeric_limits<double>::quiet_NaN()).bits == 0xfe00);
    CHECK(etude::convert<float>(1e300) == HUGE_VALF);
  }
  SECTION("random doubles against nearest-by-distance") {
    // Exponents spanning both formats' subnormals to past their overflow, all 52 fraction bits
    // random, plus the same values with the bits below a float's cleared and a tie bit set.
    int bad = 0;
    for (std::uint64_t i = 0; i < 400'000 && bad < 5; ++i) {
      const std::uint64_t r = mix(i + 77);
      const int exponent = static_cast<int>(r % 300) - 160;
      const std::uint64_t fraction = mix(r) & 0x000fffffffffffffu;
      double x = std::ldexp(1.0 + std::ldexp(static_cast<double>(fraction), -52), exponent);
      if (i % 3 == 1) x = std::ldexp(std::floor(std::ldexp(x, 30 - exponent)) + 0.5, exponent - 30);
      if (r & (1u << 20)) x = -x;
      const double want_b = nearest_bf16(x), want_h = nearest_fp16(x);
      const bf16 b = etude::convert<bf16>(x);
      const fp16 h = etude::convert<fp16>(x);
      if (decode(b) != want_b || std::signbit(decode(b)) != std::signbit(x) || decode(h) != want_h ||
          std::signbit(decode(h)) != std::signbit(x)) {
        ++bad;
        UNSCOPED_INFO("x = " << std::hexfloat << x << ": bf16 " << decode(b) << " want " << want_b << ", fp16 "
                             << decode(h) << " want " << want_h << std::defaultfloat);
      }
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("dtype: float to bf16 against nearest-by-distance, sampled", "[dtype]") {
  const auto a = sweep(structured_count, structured, matches_reference_bf16);
  INFO(describe(a));
  CHECK(a.failed == 0);
  const auto b = sweep(random_count, random_pattern, matches_reference_bf16);
  INFO(describe(b));
  CHECK(b.failed == 0);
}

TEST_CASE("dtype: float to bf16 against nearest-by-distance, all 2^32 floats", "[dtype][.exhaustive]") {
  const auto a = sweep(std::uint64_t{1} << 32, every, matches_reference_bf16);
  INFO(describe(a));
  CHECK(a.failed == 0);
}

#if defined(__FLT16_MAX__)
TEST_CASE("dtype: float to fp16 against _Float16, sampled", "[dtype]") {
  // The two compilations of the reference agree (a sample: the soft one is slow).
  const auto soft = sweep(1'000'000, random_pattern, [](std::uint32_t u) {
    const float f = f_of(u);
    return std::isnan(f) ? std::isnan(decode(fp16::from_bits(float16_soft(f)))) : float16(f) == float16_soft(f);
  });
  INFO("hardware and soft-float _Float16 conversions: " << describe(soft));
  CHECK(soft.failed == 0);
  const auto a = sweep(structured_count, structured, matches_float16);
  INFO(describe(a));
  CHECK(a.failed == 0);
  const auto b = sweep(random_count, random_pattern, matches_float16);
  INFO(describe(b));
  CHECK(b.failed == 0);
}

TEST_CASE("dtype: float to fp16 against _Float16, all 2^32 floats", "[dtype][.exhaustive]") {
  const auto a = sweep(std::uint64_t{1} << 32, every, matches_float16);
  INFO(describe(a));
  CHECK(a.failed == 0);
}
#else
TEST_CASE("dtype: float to fp16 against _Float16, sampled", "[dtype]") {
  FAIL("this compiler has no _Float16 (GCC >= 12 on x86-64 has); the fp16 reference sweep cannot run");
}
#endif

namespace {

// Float inputs for the PyTorch cross-check: the hand-picked ones of both formats and their
// neighbours, then random patterns, random values in fp16's range and exact ties of both formats.
std::vector<float> torch_inputs() {
  std::vector<std::uint32_t> u = {
      0x00000000, 0x00000001, 0x00008000, 0x00008001, 0x00010000, 0x007fc000, 0x007fffff, 0x00800000,
      0x32800000, 0x33000000, 0x33000001, 0x33800000, 0x33c00000, 0x34200000, 0x34600000, 0x387fc000,
      0x387fdfff, 0x387fe000, 0x38800000, 0x3f800000, 0x3f800fff, 0x3f801000, 0x3f801001, 0x3f803000,
      0x3f807fff, 0x3f808000, 0x3f808001, 0x3f818000, 0x477fe000, 0x477fefff, 0x477ff000, 0x47800000,
      0x7f7f0000, 0x7f7f7fff, 0x7f7f8000, 0x7f7fffff, 0x7f800000, 0x7fc00000, 0x7f800001, 0x7fffffff};
  const std::size_t hand = u.size();
  for (std::size_t i = 0; i < hand; ++i) u.push_back(u[i] | 0x80000000u);
  for (std::uint64_t i = 0; u.size() < 2048; ++i) {
    const std::uint64_t r = mix(i + 4242);
    const auto hi = static_cast<std::uint32_t>(r >> 32);
    switch (i % 4) {
      case 0: u.push_back(hi); break;  // anything
      case 1: u.push_back((hi & 0x80ffffffu) | ((102u + (hi >> 24) % 41u) << 23)); break;  // 2^-25 .. 2^16
      case 2: u.push_back((hi & 0xffffe000u) | 0x1000u); break;  // an fp16 tie where the exponent allows
      default: u.push_back((hi & 0xffff0000u) | 0x8000u); break;  // a bf16 tie
    }
  }
  std::vector<float> f;
  for (auto x : u) f.push_back(f_of(x));
  return f;
}

std::string run_capture(const std::string& cmd, int& status) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    status = -1;
    return out;
  }
  char buf[4096];
  std::size_t got = 0;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  status = ::pclose(p);
  return out;
}

}  // namespace

TEST_CASE("dtype: float to bf16 and fp16 agree with PyTorch", "[dtype][torch]") {
  // PyTorch canonicalises NaNs (bf16 to 0x7fc0 or 0xffff depending on the kernel, fp16 with the
  // sign kept), so for NaN inputs only NaN-ness is compared; everything else bit for bit.
  const std::vector<float> in = torch_inputs();
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("etude_dtype_torch_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream(dir / "in.f32", std::ios::binary)
        .write(reinterpret_cast<const char*>(in.data()), static_cast<std::streamsize>(in.size() * sizeof(float)));
    std::ofstream(dir / "convert.py")
        << "import sys, torch\n"
           "x = torch.frombuffer(bytearray(open(sys.argv[1], 'rb').read()), dtype=torch.float32)\n"
           "for dt in (torch.bfloat16, torch.float16):\n"
           "    print(' '.join(str(v & 0xffff) for v in x.to(dt).view(torch.int16).tolist()))\n";
  }
  const std::string cmd = std::string(ETUDE_PYTHON) + " " + (dir / "convert.py").string() + " " +
                          (dir / "in.f32").string() + " 2>&1";
  int status = 0;
  const std::string out = run_capture(cmd, status);
  fs::remove_all(dir);
  INFO("command: " << cmd);
  if (status != 0)
    FAIL("the PyTorch cross-check needs " << ETUDE_PYTHON << " with torch (Debian: python3-torch); it said:\n" << out);

  std::istringstream lines(out);
  std::vector<std::uint16_t> torch_bf16, torch_fp16;
  for (auto* v : {&torch_bf16, &torch_fp16}) {
    std::string line;
    std::getline(lines, line);
    std::istringstream words(line);
    unsigned x = 0;
    while (words >> x) v->push_back(static_cast<std::uint16_t>(x));
  }
  REQUIRE(torch_bf16.size() == in.size());
  REQUIRE(torch_fp16.size() == in.size());
  int bad = 0, nans = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const bf16 b(in[i]);
    const fp16 h(in[i]);
    bool ok = false;
    if (std::isnan(in[i])) {
      ++nans;
      ok = std::isnan(decode(bf16::from_bits(torch_bf16[i]))) && std::isnan(decode(b)) &&
           std::isnan(decode(fp16::from_bits(torch_fp16[i]))) && std::isnan(decode(h));
    } else {
      ok = b.bits == torch_bf16[i] && h.bits == torch_fp16[i];
    }
    if (!ok && ++bad <= 8)
      UNSCOPED_INFO("input " << hex(u_of(in[i])) << ": bf16 " << hex(b.bits) << " torch " << hex(torch_bf16[i])
                             << ", fp16 " << hex(h.bits) << " torch " << hex(torch_fp16[i]));
  }
  CHECK(nans >= 6);
  CHECK(bad == 0);
}

namespace {

template <class T>
T sample(std::uint64_t i) {
  // Floats from random patterns (NaNs, infinities, subnormals included) and, for double, random
  // doubles with bits below a float's, so that its single-rounding path is what is exercised.
  const std::uint64_t r = mix(i + 99);
  if constexpr (std::is_same_v<T, double>) {
    if (i % 2) return std::ldexp(1.0 + std::ldexp(static_cast<double>(r & 0xfffffffffffffu), -52),
                                 static_cast<int>(r >> 56) - 128);
    return static_cast<double>(f_of(static_cast<std::uint32_t>(r >> 32)));
  } else {
    return etude::convert<T>(f_of(static_cast<std::uint32_t>(r >> 32)));
  }
}

// Whether one type's values are all values of the other, so that a round trip is the identity.
template <class A, class B>
constexpr bool nested = std::is_same_v<A, B> || std::is_same_v<B, double> ||
                        (std::is_same_v<B, float> && etude::is_reduced_precision_v<A>);

template <class T>
bool same_or_both_nan(T a, T b) {
  const double x = etude::convert<double>(a), y = etude::convert<double>(b);
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y) && std::signbit(x) == std::signbit(y);
  return etude::same_bits(a, b);
}

}  // namespace

TEMPLATE_TEST_CASE("dtype: array conversion equals the scalar one, every length", "[dtype]",
                   (std::pair<float, float>), (std::pair<float, double>), (std::pair<float, bf16>),
                   (std::pair<float, fp16>), (std::pair<double, float>), (std::pair<double, double>),
                   (std::pair<double, bf16>), (std::pair<double, fp16>), (std::pair<bf16, float>),
                   (std::pair<bf16, double>), (std::pair<bf16, bf16>), (std::pair<bf16, fp16>),
                   (std::pair<fp16, float>), (std::pair<fp16, double>), (std::pair<fp16, bf16>),
                   (std::pair<fp16, fp16>)) {
  using to_t = typename TestType::first_type;
  using from_t = typename TestType::second_type;
  // Lengths around vector widths (2 to 32 lanes) and one past the parallel threshold.
  const index_t lengths[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 1000, (index_t{1} << 16) + 13};
  for (const index_t n : lengths) {
    INFO("n = " << n);
    std::vector<from_t> src(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) src[static_cast<std::size_t>(i)] = sample<from_t>(static_cast<std::uint64_t>(i));
    // One guard element past the end: the conversion must not write it.
    const to_t guard = etude::convert<to_t>(-12345.0f);
    std::vector<to_t> dst(static_cast<std::size_t>(n) + 1, guard);
    etude::convert(dst.data(), src.data(), n);
    index_t mismatched = 0;
    for (index_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (!etude::same_bits(dst[k], etude::convert<to_t>(src[k]))) ++mismatched;
    }
    CHECK(mismatched == 0);
    CHECK(etude::same_bits(dst.back(), guard));

    if constexpr (nested<from_t, to_t> || nested<to_t, from_t>) {
      // Widening then narrowing, or narrowing then widening and narrowing again, is the identity
      // (NaNs: NaN of the same sign, since widening a signalling NaN may quieten it).
      std::vector<from_t> back(static_cast<std::size_t>(n));
      etude::convert(back.data(), dst.data(), n);
      std::vector<to_t> again(static_cast<std::size_t>(n));
      etude::convert(again.data(), back.data(), n);
      index_t broken = 0;
      for (index_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        if constexpr (nested<from_t, to_t>) {
          if (!same_or_both_nan(back[k], src[k])) ++broken;
        } else {
          if (!same_or_both_nan(again[k], dst[k])) ++broken;
        }
      }
      CHECK(broken == 0);
    }
  }
}
