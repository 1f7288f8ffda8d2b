// AMX's bf16 tiles (kernels/amx_tile_product.hpp): the pair products' contract on tdpbf16ps, and
// bf16 self-attention on them against the double oracle. Every case reports itself skipped (the
// program exits 77) on a CPU without AMX, or where the kernel refuses its tile state: nothing here
// passes without having run. tests/ops/gemm.cpp and tests/ops/attention.cpp hold the contract on
// whatever path the CPU picks (AMX here, where it has them).
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>

#include "ops/bf16_attention.hpp"
#include "ops/oracle.hpp"
#include "skip.hpp"

using cpu = etude::backend::cpu;
using etude::bf16;
using etude::index_t;
using namespace etude::test::ops;
namespace pairs = etude::backend::cpu_detail::tile_product;
namespace isa = etude::backend::cpu_detail::isa;

namespace {

// Whether this CPU and kernel give AMX tiles; if so, word products take them (whatever ETUDE_AMX says).
bool amx_here() {
  if (isa::amx_bf16()) {
    pairs::set_amx_tiles(true);
    return true;
  }
  const bool refused = isa::amx_bf16_state() == isa::amx_state::refused;
  ETUDE_TEST_SKIP((refused ? "the CPU has AMX, but the kernel refused its tile state (arch_prctl)"
                           : "this CPU has no AMX bf16 tiles (grep amx_bf16 /proc/cpuinfo)"));
  return false;
}

// Word products on AMX tiles, or on vdpbf16ps, while it lives.
class amx_scope {
 public:
  explicit amx_scope(bool on) { pairs::set_amx_tiles(on); }
  ~amx_scope() { pairs::set_amx_tiles(was_); }
  amx_scope(const amx_scope&) = delete;
  amx_scope& operator=(const amx_scope&) = delete;

 private:
  bool was_ = pairs::amx_enabled().load();
};

// A (m × k) in bf16 rows of even length (zero past k, and where a causal kind says), B (k × n) paired
// by rows, and A's transpose paired (A(i, p) at word p·ld_t + i).
struct operands {
  index_t m, n, k, pair_count, lda, ldb, ld_t;
  std::vector<bf16> a, b;
  std::vector<pairs::word> b_pairs, a_t;
  operands(index_t m_, index_t n_, index_t k_, std::uint64_t seed, pairs::causal shape = {})
      : m(m_), n(n_), k(k_), pair_count((k_ + 1) / 2), lda(2 * pair_count), ldb(pairs::padded(n_) + 16),
        ld_t(pairs::padded(m_)) {
    a.assign(std::size_t(m * lda), bf16(0.0f));
    b.resize(std::size_t(k * n));
    const auto av = random_vector(a.size(), seed), bv = random_vector(b.size(), seed + 1);
    for (index_t i = 0; i < m; ++i)
      for (index_t p = 0; p < k; ++p) {
        const bool zero = (shape.what == pairs::causal::reduction_to_row && p > shape.offset + i) ||
                          (shape.what == pairs::causal::reduction_from_row && p < shape.offset + i);
        if (!zero) a[std::size_t(i * lda + p)] = bf16(float(av[std::size_t(i * lda + p)]));
      }
    for (std::size_t x = 0; x < b.size(); ++x) b[x] = bf16(float(bv[x]));
    b_pairs.assign(std::size_t(pair_count * ldb), 0xFFFFFFFFu);  // NaN pairs past padded(n): never read
    pairs::pack_rows(b_pairs.data(), ldb, b.data(), n, k, n);
    std::vector<bf16> at(std::size_t(lda * m), bf16(0.0f));
    for (index_t i = 0; i < m; ++i)
      for (index_t p = 0; p < lda; ++p) at[std::size_t(p * m + i)] = a[std::size_t(i * lda + p)];
    a_t.assign(std::size_t(pair_count * ld_t), 0u);
    pairs::pack_rows(a_t.data(), ld_t, at.data(), m, lda, m);
  }
  const pairs::word* a_rows() const { return reinterpret_cast<const pairs::word*>(a.data()); }

  // C (m × ldc) = alpha·A·B + beta·C0 by product(): A row-major, or seen transposed
  template <class TC>
  std::vector<TC> product(const std::vector<TC>& c0, index_t ldc, float alpha, float beta, bool transposed,
                          pairs::causal shape = {}) const {
    std::vector<TC> c = c0;
    if (transposed)
      pairs::product(m, n, pair_count, alpha, a_t.data(), 1, ld_t, b_pairs.data(), ldb, beta, c.data(), ldc, shape);
    else
      pairs::product(m, n, pair_count, alpha, a_rows(), lda / 2, 1, b_pairs.data(), ldb, beta, c.data(), ldc, shape);
    return c;
  }
};

std::vector<float> random_c(index_t size, std::uint64_t seed) {
  const auto v = random_vector(std::size_t(size), seed);
  return {v.begin(), v.end()};
}

bool same(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("AMX pair products: float roundings of the exact sums, A read in place or seen transposed, the same bits",
          "[ops][amx]") {
  if (!amx_here()) return;
  REQUIRE(pairs::amx_tiles());
  // partial tiles of rows, columns and reduction; whole 2 × 2 blocks; one output; a long reduction
  for (const auto [m, n, k] : {std::array<index_t, 3>{7, 33, 9}, {64, 64, 130}, {13, 130, 64}, {1, 1, 1},
                               {70, 17, 2}, {32, 32, 32}, {100, 200, 1030}}) {
    INFO("m " << m << " n " << n << " k " << k);
    const operands o(m, n, k, 71);
    const index_t ldc = n + 3;
    index_t differs_from_dots = 0;
    for (const float beta : {0.0f, 0.5f}) {
      const auto c0 = random_c(m * ldc, 73);
      const auto rows = o.product(c0, ldc, 0.25f, beta, false), seen_t = o.product(c0, ldc, 0.25f, beta, true);
      // the transposed A is staged into the same tiles: the same words, the same sums
      CHECK(same(rows, seen_t));
      double worst = 0.0;
      for (index_t i = 0; i < m; ++i) {
        for (index_t j = 0; j < n; ++j) {
          double sum = 0.0, magnitude = 0.0;
          for (index_t p = 0; p < k; ++p) {
            const double t = double(float(o.a[std::size_t(i * o.lda + p)])) * double(float(o.b[std::size_t(p * n + j)]));
            sum += t;
            magnitude += std::abs(t);
          }
          const double c = c0[std::size_t(i * ldc + j)];
          const double bound = double(k + 2) * 0x1p-24 * (0.25 * magnitude + beta * std::abs(c));
          worst = std::max(worst, std::abs(rows[std::size_t(i * ldc + j)] - (0.25 * sum + beta * c)) / (bound + 1e-30));
        }
        for (index_t j = n; j < ldc; ++j) CHECK(rows[std::size_t(i * ldc + j)] == c0[std::size_t(i * ldc + j)]);
      }
      CHECK(worst <= 1.0);
      const amx_scope dots(false);
      const auto on_dots = o.product(c0, ldc, 0.25f, beta, false);
      for (std::size_t x = 0; x < rows.size(); ++x) differs_from_dots += rows[x] != on_dots[x];
    }
    // where a sum has more than one term, tdpbf16ps groups it otherwise than vdpbf16ps: the products
    // really ran on the tiles (one-pair sums are exact either way)
    if (k > 2 && m * n > 64) CHECK(differs_from_dots > 0);
  }
}

TEST_CASE("AMX pair products: a causal operand's steps left out, or a product cut in pieces, give the whole "
          "product's bits",
          "[ops][amx]") {
  if (!amx_here()) return;
  using causal = pairs::causal;
  for (const auto [m, n, k, offset] : {std::array<index_t, 4>{64, 128, 128, 64}, {37, 70, 71, 33}, {17, 16, 40, 0},
                                       {70, 150, 150, 80}, {5, 9, 9, 3}, {64, 64, 64, 0}, {96, 300, 300, 200}}) {
    for (const auto what : {causal::columns_to_row, causal::reduction_to_row, causal::reduction_from_row}) {
      INFO("m " << m << " n " << n << " k " << k << " offset " << offset << " kind " << int(what));
      const operands o(m, n, k, 81, causal{what, offset});
      const index_t ldc = n + 5;
      for (const bool transposed : {false, true}) {
        const auto c0 = random_c(m * ldc, 83);
        const auto full = o.product(c0, ldc, 0.5f, 0.5f, transposed);
        const auto cut = o.product(c0, ldc, 0.5f, 0.5f, transposed, causal{what, offset});
        index_t differ = 0, unwritten = 0;
        for (index_t i = 0; i < m; ++i)
          for (index_t j = 0; j < ldc; ++j) {
            const auto x = std::size_t(i * ldc + j);
            if (j >= n) CHECK(cut[x] == c0[x]);
            if (what == causal::columns_to_row && j > offset + i) {
              unwritten += j < n && cut[x] == c0[x];
              continue;
            }
            differ += std::memcmp(&full[x], &cut[x], sizeof(float)) != 0;
          }
        CHECK(differ == 0);
        // whole tiles past every row's diagonal are left as they were
        if (what == causal::columns_to_row && offset / 16 + 1 < (n + 15) / 16) CHECK(unwritten > 0);
      }
    }
  }
  // rows and columns in pieces of any size: each output's sum is grouped by the reduction alone
  const operands o(90, 100, 250, 91);
  const index_t ldc = 100;
  const auto c0 = random_c(90 * ldc, 93);
  const auto whole = o.product(c0, ldc, 1.0f, 0.0f, false);
  auto pieces = c0;
  for (const auto [i0, i1] : {std::array<index_t, 2>{0, 7}, {7, 40}, {40, 90}})
    for (const auto [j0, j1] : {std::array<index_t, 2>{0, 16}, {16, 37}, {37, 100}})
      pairs::product(i1 - i0, j1 - j0, o.pair_count, 1.0f, o.a_rows() + i0 * (o.lda / 2), o.lda / 2, 1,
                     o.b_pairs.data() + j0, o.ldb, 0.0f, pieces.data() + i0 * ldc + j0, ldc);
  CHECK(same(whole, pieces));
}

TEST_CASE("AMX pair products round a bf16 C as bf16(float) rounds, NaN and infinity included", "[ops][amx]") {
  if (!amx_here()) return;
  const index_t m = 13, n = 70, k = 40;
  operands o(m, n, k, 95);
  for (std::size_t x = 0; x < o.a.size(); x += 7) o.a[x] = bf16(float(o.a[x]) * 1e30f);
  o.a[std::size_t(3 * o.lda + 5)] = bf16(INFINITY);
  o.a[std::size_t(7 * o.lda + 2)] = bf16(std::nanf(""));
  for (const float beta : {0.0f, 1.0f}) {
    const auto c0 = random_c(m * n, 97);
    std::vector<bf16> n0(c0.size());
    for (std::size_t x = 0; x < c0.size(); ++x) n0[x] = bf16(c0[x]);
    const std::vector<float> w0(n0.begin(), n0.end());  // the bf16 C's values, widened
    const auto wide = o.product(w0, n, 1.0f, beta, false);
    const auto narrow = o.product(n0, n, 1.0f, beta, false);
    index_t differ = 0, special = 0;
    for (std::size_t x = 0; x < wide.size(); ++x) {
      differ += bf16(wide[x]).bits != narrow[x].bits;
      special += !std::isfinite(wide[x]);
    }
    CHECK(differ == 0);
    CHECK(special >= 2 * n - 2);
  }
}

TEST_CASE("bf16 attention on AMX tiles stays within the rounding of its probabilities and dS, odd lengths and "
          "causal corners",
          "[ops][amx]") {
  if (!amx_here()) return;
  REQUIRE(attention_dots());
  CHECK(cpu::attention_products().find("AMX tile kernels") != std::string::npos);
  // one row, rows inside one tile, a block's corner, several blocks and a long sequence's taller ones
  std::vector<std::vector<bf16>> on_tiles;
  for (const index_t steps : {index_t(1), index_t(17), index_t(33), cpu::attention_rows(64) + 9, index_t(600)}) {
    INFO("steps " << steps);
    on_tiles.push_back(check_bf16_attention(1, steps, 2));
  }
  // the same on vdpbf16ps, named so, within the same bounds; the outputs differ
  const amx_scope dots(false);
  CHECK(cpu::attention_products().find("vdpbf16ps") != std::string::npos);
  CHECK(cpu::attention_products().find("AMX turned off") != std::string::npos);
  const auto on_dots = check_bf16_attention(1, 600, 2);
  CHECK(!same_bits(on_tiles.back(), on_dots));
}

TEST_CASE("bf16 products on etude's own kernels run on AMX tiles with the same bits on any team size",
          "[ops][amx]") {
  if (!amx_here()) return;
  const bool was = cpu::own_bf16_products();
  cpu::set_own_bf16_products(true);
  CHECK(cpu::bf16_products().find("AMX tile kernels") != std::string::npos);
  const index_t m = 150, n = 200, k = 515;
  const auto av = random_vector(std::size_t(m * k), 101), bv = random_vector(std::size_t(k * n), 102);
  std::vector<bf16> a(av.size()), b(bv.size());
  for (std::size_t x = 0; x < a.size(); ++x) a[x] = bf16(float(av[x]));
  for (std::size_t x = 0; x < b.size(); ++x) b[x] = bf16(float(bv[x]));
  const auto product = [&](int threads) {
    std::vector<float> c(std::size_t(m * n));
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    cpu::gemm(false, true, m, n, k, 1.0, a.data(), k, b.data(), k, 0.0, c.data(), n);
    omp_set_num_threads(before);
    return c;
  };
  const auto one = product(1), two = product(2);
  CHECK(same(one, two));
  {
    // the same gemm on vdpbf16ps gives other bits: the products above really ran on the tiles
    const amx_scope dots(false);
    CHECK(cpu::bf16_products().find("AVX512_BF16 kernels") != std::string::npos);
    CHECK(!same(one, product(2)));
  }
  double worst = 0.0;
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (index_t p = 0; p < k; ++p) {
        const double t = double(float(a[std::size_t(i * k + p)])) * double(float(b[std::size_t(j * k + p)]));
        sum += t;
        magnitude += std::abs(t);
      }
      worst = std::max(worst, std::abs(one[std::size_t(i * n + j)] - sum) / (double(k + 2) * 0x1p-24 * magnitude));
    }
  CHECK(worst <= 1.0);
  cpu::set_own_bf16_products(was);
}
