// .npy codes: every integer dtype and format version NumPy writes reads back exactly, the bytes
// np.save produces are understood, and every other layout is refused with the file and the fix.
#include <catch2/catch.hpp>

#include <functional>

#include <etude/data/npy.hpp>

#include "support.hpp"

namespace data = etude::data;
using etude::test::message_of;
using etude::test::scratch_dir;
using etude::test::write_npy;

namespace {

template <class T>
void round_trip(const std::string& descr, int major) {
  scratch_dir dir;
  const auto p = dir / "codes.npy";
  std::vector<T> v;
  for (int i = 0; i < 3 * 7; ++i) v.push_back(static_cast<T>(i * 5 % 127));
  v[4] = static_cast<T>(std::is_signed_v<T> ? -3 : 100);
  write_npy(p, descr, {3, 7}, v, major);
  const auto c = data::read_npy_codes(p);
  CHECK(c.dtype == descr);
  CHECK(c.codebooks == 3);
  CHECK(c.frames == 7);
  REQUIRE(c.values.size() == v.size());
  bool same = true;
  for (std::size_t i = 0; i < v.size(); ++i) same = same && c.values[i] == static_cast<std::int64_t>(v[i]);
  CHECK(same);
}

}  // namespace

TEST_CASE("every integer dtype and format version reads back", "[npy]") {
  const int major = GENERATE(1, 2, 3);
  CAPTURE(major);
  round_trip<std::int16_t>("<i2", major);
  round_trip<std::int32_t>("<i4", major);
  round_trip<std::int64_t>("<i8", major);
  round_trip<std::uint16_t>("<u2", major);
  round_trip<std::uint32_t>("<u4", major);
  round_trip<std::uint64_t>("<u8", major);
  round_trip<std::uint8_t>("|u1", major);
  round_trip<std::int8_t>("|i1", major);
  round_trip<std::int32_t>("=i4", major);
}

TEST_CASE("bytes written by numpy.save are understood", "[npy]") {
  // np.save(f, np.array([[0, 1, 2], [2047, 5, 6]], dtype='<i2')), byte for byte
  std::vector<unsigned char> b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0x76, 0};
  const std::string dict = "{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3), }";
  b.insert(b.end(), dict.begin(), dict.end());
  b.insert(b.end(), 128 - 1 - b.size(), ' ');
  b.push_back('\n');
  for (int v : {0, 1, 2, 2047, 5, 6}) {
    b.push_back(static_cast<unsigned char>(v & 0xff));
    b.push_back(static_cast<unsigned char>(v >> 8));
  }
  REQUIRE(b.size() == 140);
  scratch_dir dir;
  etude::test::write_bytes(dir / "np.npy", b);
  const auto c = data::read_npy_codes(dir / "np.npy");
  CHECK(c.codebooks == 2);
  CHECK(c.frames == 3);
  CHECK(c.values == std::vector<std::int64_t>{0, 1, 2, 2047, 5, 6});
}

TEST_CASE("a leading batch dimension of one is squeezed", "[npy]") {
  scratch_dir dir;
  write_npy(dir / "b.npy", "<i8", {1, 4, 2}, std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
  const auto c = data::read_npy_codes(dir / "b.npy");
  CHECK(c.codebooks == 4);
  CHECK(c.frames == 2);
  CHECK(c.values[7] == 8);
}

TEST_CASE("other layouts are refused with the file and the fix", "[npy][bad_input]") {
  scratch_dir dir;
  const auto p = dir / "x.npy";
  const std::vector<std::int16_t> six = {1, 2, 3, 4, 5, 6};
  auto msg = [&] { return message_of([&] { data::read_npy_codes(p); }); };

  write_npy(p, ">i2", {2, 3}, six);
  CHECK_THAT(msg(), Catch::Contains("x.npy") && Catch::Contains("dtype '>i2'") && Catch::Contains("astype"));
  write_npy(p, "<f4", {2, 3}, std::vector<float>(6, 1.0f));
  CHECK_THAT(msg(), Catch::Contains("dtype '<f4'"));
  write_npy(p, "<i2", {2, 3}, six, 1, true);
  CHECK_THAT(msg(), Catch::Contains("Fortran order"));
  write_npy(p, "<i2", {6}, six);
  CHECK_THAT(msg(), Catch::Contains("shape (6)"));
  write_npy(p, "<i2", {2, 1, 3}, six);
  CHECK_THAT(msg(), Catch::Contains("shape (2, 1, 3)"));
  write_npy(p, "<i2", {2, 4}, six);
  CHECK_THAT(msg(), Catch::Contains("truncated"));
  write_npy(p, "<i2", {0, 3}, std::vector<std::int16_t>{});
  CHECK_THAT(msg(), Catch::Contains("0 codebooks"));

  write_npy(p, "<i2", {2, 3}, six);
  auto b = etude::test::read_bytes(p);
  auto bad = b;
  bad[1] = 'X';
  etude::test::write_bytes(p, bad);
  CHECK_THAT(msg(), Catch::Contains("not a .npy file"));
  bad = b;
  bad[6] = 4;
  etude::test::write_bytes(p, bad);
  CHECK_THAT(msg(), Catch::Contains("version 4.0"));
  etude::test::write_bytes(p, {b.begin(), b.begin() + 40});
  CHECK_THAT(msg(), Catch::Contains("truncated .npy header"));
  etude::test::write_bytes(p, {b.begin(), b.begin() + 5});
  CHECK_THAT(msg(), Catch::Contains("not a .npy file"));
  bad = b;
  bad[10] = '[';
  etude::test::write_bytes(p, bad);
  CHECK_THAT(msg(), Catch::Contains("malformed .npy header"));
  CHECK_THAT(message_of([&] { data::read_npy_codes(dir / "absent.npy"); }), Catch::Contains("absent.npy"));
}
