// CRC-32C against published vectors (RFC 3720, B.4) and a bit-at-a-time reference written from
// the definition; the table and the SSE4.2 paths against each other; TFRecord's masking.
// Built twice: plain, and with -msse4.2 (ETUDE_TEST_EXPECT_SSE42) where the compiler can.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <etude/core/rng.hpp>
#include <etude/core/detail/crc32c.hpp>

#include "../skip.hpp"

using namespace etude::detail;

namespace {

// The definition: reflected register, polynomial 0x82F63B78, one bit at a time.
std::uint32_t crc32c_bitwise(const std::vector<unsigned char>& bytes) {
  std::uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

std::vector<unsigned char> random_bytes(std::size_t n, std::uint64_t seed) {
  etude::rng r(seed, 1);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(r.below(256));
  return v;
}

}  // namespace

// Usable in constant expressions.
static_assert(crc32c("123456789") == 0xE3069283u);
static_assert(crc32c("") == 0u);
static_assert(masked_crc32c(0) == 0xa282ead8u);

TEST_CASE("crc32c: the published check value and RFC 3720's vectors", "[track][crc32c]") {
  const std::string check = "123456789";
  CHECK(crc32c(check.data(), check.size()) == 0xE3069283u);
  CHECK(crc32c(std::string_view(check)) == 0xE3069283u);
  CHECK(crc32c_extend_table(0, check.data(), check.size()) == 0xE3069283u);

  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xff), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[static_cast<std::size_t>(i)] = static_cast<unsigned char>(i);
    down[static_cast<std::size_t>(i)] = static_cast<unsigned char>(31 - i);
  }
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
  CHECK(crc32c(ones.data(), ones.size()) == 0x62A8AB43u);
  CHECK(crc32c(up.data(), up.size()) == 0x46DD794Eu);
  CHECK(crc32c(down.data(), down.size()) == 0x113FDB5Cu);
  CHECK(crc32c(nullptr, 0) == 0u);

  // The reference agrees on the same vectors, so it can judge the rest.
  CHECK(crc32c_bitwise(zeros) == 0x8A9136AAu);
  CHECK(crc32c_bitwise(up) == 0x46DD794Eu);
}

TEST_CASE("crc32c: every length and alignment agrees with the bitwise reference, on both paths", "[track][crc32c]") {
#ifdef ETUDE_TEST_EXPECT_SSE42
  REQUIRE(crc32c_uses_sse42);
  if (!__builtin_cpu_supports("sse4.2")) {
    ETUDE_TEST_SKIP("this CPU has no SSE4.2; the instruction path cannot run here");
    return;
  }
#else
  INFO("SSE4.2 path compiled in: " << crc32c_uses_sse42);
#endif
  const auto data = random_bytes(600, 7);
  for (std::size_t offset = 0; offset < 9; ++offset) {
    for (std::size_t n = 0; n + offset <= data.size(); n += (n < 80 ? 1 : 37)) {
      const std::vector<unsigned char> slice(data.begin() + static_cast<std::ptrdiff_t>(offset),
                                             data.begin() + static_cast<std::ptrdiff_t>(offset + n));
      const std::uint32_t want = crc32c_bitwise(slice);
      INFO("offset " << offset << ", length " << n);
      REQUIRE(crc32c(data.data() + offset, n) == want);
      REQUIRE(crc32c_extend_table(0, data.data() + offset, n) == want);
    }
  }
}

TEST_CASE("crc32c: extending equals summing the concatenation", "[track][crc32c]") {
  const auto data = random_bytes(257, 11);
  const std::uint32_t whole = crc32c(data.data(), data.size());
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{100}, data.size()}) {
    INFO("cut at " << cut);
    const std::uint32_t head = crc32c(data.data(), cut);
    CHECK(crc32c_extend(head, data.data() + cut, data.size() - cut) == whole);
    CHECK(crc32c_extend_table(head, data.data() + cut, data.size() - cut) == whole);
  }
  // A changed byte changes the sum.
  auto flipped = data;
  flipped[100] ^= 0x10;
  CHECK(crc32c(flipped.data(), flipped.size()) != whole);
}

TEST_CASE("crc32c: TFRecord's masked form", "[track][crc32c]") {
  // Values from the tensorboard package's own masked_crc32c (pure Python).
  CHECK(masked_crc32c(crc32c("")) == 0xa282ead8u);
  CHECK(masked_crc32c(crc32c("123456789")) == 0xc78ab0e5u);
  // The formula, spelled out: rotate right by 15, add the constant, all mod 2^32.
  const std::uint32_t c = 0xE3069283u;
  CHECK(masked_crc32c(c) == static_cast<std::uint32_t>(((c >> 15) | (c << 17)) + 0xa282ead8u));
  for (std::uint32_t x : {0u, 1u, 0x7fffu, 0x80000000u, 0xffffffffu, 0x5d5d1234u}) CHECK(unmask_crc32c(masked_crc32c(x)) == x);
}
