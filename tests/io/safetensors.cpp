// safetensors without Python: every dtype round-trips byte for byte; the writer's bytes are exactly
// the documented layout (checked against a file spelled out by hand); scalars, empty tensors, no
// tensors and many tensors work; the 16-bit float formats widen exactly; and every malformed file
// (each rule of the format broken once) is refused with a message naming the file and the problem.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <etude/io/safetensors.hpp>

#include "../data/support.hpp"

namespace io = etude::io;
using etude::test::message_of;
using etude::test::read_bytes;
using etude::test::scratch_dir;
using etude::test::write_bytes;
using Catch::Matchers::Contains;

namespace {

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 131u + seed * 29u + 7u) * 2654435761u >> 13);
  return b;
}

// A file from a header text and data bytes; the header size field is the header's length unless given.
void craft(const std::filesystem::path& p, const std::string& header, std::size_t data_bytes,
           std::optional<std::uint64_t> size_field = std::nullopt) {
  std::vector<unsigned char> out(8);
  const std::uint64_t n = size_field.value_or(header.size());
  std::memcpy(out.data(), &n, 8);
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0x5a);
  write_bytes(p, out);
}

// prefix + i, built by appending: g++ 12 misreports "literal" + std::string (-Wrestrict)
std::string numbered(const char* prefix, std::size_t i) {
  std::string s(prefix);
  s += std::to_string(i);
  return s;
}

std::string refusal(const std::filesystem::path& p) {
  return message_of<io::safetensors_error>([&] { io::safetensors_file f(p); });
}

}  // namespace

TEST_CASE("dtype names and sizes follow the format", "[safetensors]") {
  STATIC_REQUIRE(io::dtype_name(io::dtype::bf16) == "BF16");
  STATIC_REQUIRE(io::dtype_size(io::dtype::c64) == 8);
  STATIC_REQUIRE(io::dtype_size(io::dtype::f8_e4m3) == 1);
  STATIC_REQUIRE(*io::dtype_from_name("U16") == io::dtype::u16);
  STATIC_REQUIRE(!io::dtype_from_name("f32"));  // names are case-sensitive
  const std::vector<std::pair<std::string, std::uint64_t>> all = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"C64", 8},     {"F64", 8}, {"I64", 8}, {"U64", 8}};
  for (const auto& [name, size] : all) {
    const auto t = io::dtype_from_name(name);
    REQUIRE(t);
    CHECK(io::dtype_name(*t) == name);
    CHECK(io::dtype_size(*t) == size);
  }
  CHECK(io::element_count({}) == 1u);
  CHECK(io::element_count({3, 0, 5}) == 0u);
  CHECK(!io::element_count({1ull << 40, 1ull << 40}));
}

TEST_CASE("every dtype round-trips byte for byte, in the documented layout", "[safetensors]") {
  scratch_dir dir;
  const auto path = dir / "all.safetensors";
  std::vector<std::vector<std::byte>> keep;
  io::safetensors_writer w;
  unsigned seed = 0;
  for (const auto& d : io::detail::dtype_table) {
    const std::vector<std::vector<std::uint64_t>> shapes = {{3, 5}, {7}, {}, {2, 0, 3}, {1, 2, 1, 3}};
    for (std::size_t s = 0; s < shapes.size(); ++s) {
      keep.push_back(pattern(*io::element_count(shapes[s]) * d.size, ++seed));
      w.add(std::string(d.name) + "." + std::to_string(s), d.type, shapes[s], keep.back());
    }
  }
  w.metadata("producer", "etude test").metadata("note", "caf\xc3\xa9 \"quoted\"\n");
  w.write(path);

  io::safetensors_file f(path);
  CHECK(f.header_bytes() % 8 == 0);
  CHECK(f.size() == keep.size());
  CHECK(f.names() == w.layout_order());
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.metadata().at("producer") == "etude test");
  CHECK(f.metadata().at("note") == "caf\xc3\xa9 \"quoted\"\n");
  CHECK(f.metadata().size() == 3);

  std::size_t i = 0;
  seed = 0;
  for (const auto& d : io::detail::dtype_table) {
    const std::vector<std::vector<std::uint64_t>> shapes = {{3, 5}, {7}, {}, {2, 0, 3}, {1, 2, 1, 3}};
    for (std::size_t s = 0; s < shapes.size(); ++s, ++i) {
      const auto& t = f.info(std::string(d.name) + "." + std::to_string(s));
      INFO(d.name << " shape " << s);
      CHECK(t.type == d.type);
      CHECK(t.shape == shapes[s]);
      CHECK(t.end - t.begin == keep[i].size());
      REQUIRE(t.bytes.size() == keep[i].size());
      CHECK(std::equal(t.bytes.begin(), t.bytes.end(), keep[i].begin()));
      CHECK(t.begin % d.size == 0);  // the layout keeps every tensor aligned to its element size
    }
  }

  // Layout: dtypes largest first (U64 ... BOOL), names bytewise within a dtype, back to back.
  std::uint64_t cursor = 0;
  int last_type = 1000;
  std::string last_name;
  for (const auto& name : f.names()) {
    const auto& t = f.info(name);
    CHECK(t.begin == cursor);
    cursor = t.end;
    const int type = static_cast<int>(t.type);
    CHECK(type <= last_type);
    if (type == last_type) CHECK(last_name < name);
    last_type = type;
    last_name = name;
  }
  CHECK(8 + f.header_bytes() + cursor == std::filesystem::file_size(path));
}

TEST_CASE("the writer's bytes are exactly the format, spelled out by hand", "[safetensors]") {
  scratch_dir dir;
  const std::vector<float> b = {1.0f, -2.0f};
  const std::vector<std::uint8_t> a = {1, 2, 3};
  const std::vector<std::int64_t> c = {-1};
  io::safetensors_writer w;
  w.add("b", b, {2}).add("a", a, {3}).add("c", c, {});
  w.write(dir / "x.safetensors");

  std::string header =
      R"({"__metadata__":{"format":"pt"},"c":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"a":{"dtype":"U8","shape":[3],"data_offsets":[16,19]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<unsigned char> want(8);
  const std::uint64_t n = header.size();
  std::memcpy(want.data(), &n, 8);
  for (char ch : header) want.push_back(static_cast<unsigned char>(ch));
  for (unsigned char x : {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) want.push_back(x);  // int64 -1
  for (unsigned char x : {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0}) want.push_back(x);  // 1.0f, -2.0f
  for (unsigned char x : {1, 2, 3}) want.push_back(x);
  CHECK(w.header() == header);
  CHECK(read_bytes(dir / "x.safetensors") == want);
  CHECK(header.size() % 8 == 0);
}

TEST_CASE("typed access checks the dtype and reads in place", "[safetensors]") {
  scratch_dir dir;
  const std::vector<float> f32 = {0.5f, -1.25f, 3.0f, 1e-30f, std::numeric_limits<float>::infinity(), -0.0f};
  const std::vector<double> f64 = {1.0 / 3.0, -1e300};
  const std::vector<std::int32_t> i32 = {-7, 2147483647};
  const std::vector<std::uint64_t> u64 = {18446744073709551615ull};
  const std::vector<std::int8_t> i8 = {-128, 127, 0};
  io::safetensors_writer w;
  w.add("f32", f32, {2, 3});
  w.add("f64", std::span<const double>(f64), {2});
  w.add("i32", i32, {2}).add("u64", u64, {1}).add("i8", i8, {3});
  w.write(dir / "t.safetensors");

  io::safetensors_file f(dir / "t.safetensors");
  const auto s = f.as<float>("f32");
  REQUIRE(s.size() == f32.size());
  CHECK(std::memcmp(s.data(), f32.data(), 24) == 0);
  CHECK(f.copy<double>("f64") == f64);
  CHECK(std::vector<std::int32_t>(f.as<std::int32_t>("i32").begin(), f.as<std::int32_t>("i32").end()) == i32);
  CHECK(f.as<std::uint64_t>("u64")[0] == 18446744073709551615ull);
  CHECK(f.copy<std::int8_t>("i8") == i8);
}

TEST_CASE("typed access refuses the wrong type, and 16-bit floats widen exactly", "[safetensors]") {
  scratch_dir dir;
  const std::vector<std::uint16_t> f16_bits = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0x7c00, 0xfc00, 0x8000, 0x7e01};
  const std::vector<std::uint16_t> bf16_bits = {0x3f80, 0xc0a0, 0x0001, 0x7f80, 0xff81};
  const std::vector<double> f64 = {0.1, -3.0};
  const std::vector<std::int32_t> i32 = {1, 2};
  io::safetensors_writer w;
  w.add("h", io::dtype::f16, {f16_bits.size()}, std::as_bytes(std::span(f16_bits)));
  w.add("bh", io::dtype::bf16, {bf16_bits.size()}, std::as_bytes(std::span(bf16_bits)));
  w.add("d", f64, {2}).add("i", i32, {2});
  const auto path = dir / "t.safetensors";
  w.write(path);
  io::safetensors_file f(path);

  auto m = message_of<io::safetensors_error>([&] { (void)f.as<std::uint16_t>("h"); });
  CHECK_THAT(m, Contains(path.string()) && Contains("tensor \"h\" is F16, not the U16") && Contains("to_float"));
  m = message_of<io::safetensors_error>([&] { (void)f.copy<float>("d"); });
  CHECK_THAT(m, Contains("tensor \"d\" is F64, not the F32"));
  m = message_of<io::safetensors_error>([&] { (void)f.to_float("i"); });
  CHECK_THAT(m, Contains("tensor \"i\" is I32") && Contains("F16, BF16, F32 and F64"));
  m = message_of<io::safetensors_error>([&] { (void)f.info("nope"); });
  CHECK_THAT(m, Contains(path.string()) && Contains("no tensor named \"nope\"") && Contains("\"bh\""));
  CHECK(!f.contains("nope"));

  const auto h = f.to_float("h");
  CHECK(h[0] == 1.0f);
  CHECK(h[1] == -2.0f);
  CHECK(h[2] == 65504.0f);
  CHECK(h[3] == std::ldexp(1.0f, -24));                 // smallest subnormal
  CHECK(h[4] == std::ldexp(1023.0f, -24));              // largest subnormal
  CHECK(h[5] == std::numeric_limits<float>::infinity());
  CHECK(h[6] == -std::numeric_limits<float>::infinity());
  CHECK((h[7] == 0.0f && std::signbit(h[7])));
  CHECK(std::bit_cast<std::uint32_t>(h[8]) == 0x7fc02000u);  // NaN keeps its payload
  const auto b = f.to_float("bh");
  CHECK(b[0] == 1.0f);
  CHECK(b[1] == -5.0f);
  CHECK(std::bit_cast<std::uint32_t>(b[2]) == 0x00010000u);
  CHECK(b[3] == std::numeric_limits<float>::infinity());
  CHECK(std::bit_cast<std::uint32_t>(b[4]) == 0xff810000u);
  const auto d = f.to_float("d");
  CHECK(d[0] == 0.1f);
  CHECK(d[1] == -3.0f);
}

TEST_CASE("edge cases: no tensors, scalars, empty tensors, many tensors", "[safetensors]") {
  scratch_dir dir;
  {
    io::safetensors_writer w;
    w.write(dir / "none.safetensors");
    io::safetensors_file f(dir / "none.safetensors");
    CHECK(f.size() == 0);
    CHECK(f.names().empty());
    CHECK(f.metadata().at("format") == "pt");
    CHECK(std::filesystem::file_size(dir / "none.safetensors") == 8 + f.header_bytes());
  }
  {
    const std::vector<float> one = {4.5f}, none;
    io::safetensors_writer w;
    w.add("scalar", one, {}).add("e0", none, {0}).add("e1", none, {4, 0}).add("e2", none, {0, 0, 7});
    w.write(dir / "edge.safetensors");
    io::safetensors_file f(dir / "edge.safetensors");
    CHECK(f.info("scalar").shape.empty());
    CHECK(f.as<float>("scalar")[0] == 4.5f);
    CHECK(f.info("e1").shape == std::vector<std::uint64_t>{4, 0});
    CHECK(f.as<float>("e2").empty());
    CHECK(f.copy<float>("e0").empty());
    CHECK(f.to_float("e1").empty());
    // empty tensors share an offset; file order breaks the tie by name
    CHECK(f.names() == std::vector<std::string>{"e0", "e1", "e2", "scalar"});
  }
  {
    std::vector<std::vector<std::int16_t>> data;
    io::safetensors_writer w;
    for (std::size_t i = 0; i < 1000; ++i) data.emplace_back(i % 7, static_cast<std::int16_t>(i));
    for (std::size_t i = 0; i < 1000; ++i) w.add(numbered("t", i), data[i], {data[i].size()});
    w.write(dir / "many.safetensors");
    io::safetensors_file f(dir / "many.safetensors");
    REQUIRE(f.size() == 1000);
    for (std::size_t i = 0; i < 1000; i += 37) CHECK(f.copy<std::int16_t>(numbered("t", i)) == data[i]);
  }
}

TEST_CASE("a moved file keeps its views, and an overwrite is atomic", "[safetensors]") {
  scratch_dir dir;
  const std::vector<float> v = {1, 2, 3};
  io::safetensors_writer w;
  w.add("v", v, {3});
  w.write(dir / "m.safetensors");
  io::safetensors_file a(dir / "m.safetensors");
  const auto span = a.as<float>("v");
  io::safetensors_file b = std::move(a);
  CHECK(b.as<float>("v").data() == span.data());
  CHECK(span[2] == 3.0f);

  const std::vector<float> u = {9};
  io::safetensors_writer w2;
  w2.add("u", u, {1});
  w2.write(dir / "m.safetensors");  // replaces the file; the open mapping still sees the old one
  CHECK(span[2] == 3.0f);
  io::safetensors_file c(dir / "m.safetensors");
  CHECK(c.names() == std::vector<std::string>{"u"});
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("the writer refuses bad tensors and metadata at once, naming them", "[safetensors]") {
  const std::vector<float> v = {1, 2, 3};
  io::safetensors_writer w;
  w.add("v", v, {3});
  using etude::invalid_argument;
  CHECK_THAT(message_of<invalid_argument>([&] { w.add("v", v, {3}); }), Contains("\"v\": added twice"));
  CHECK_THAT(message_of<invalid_argument>([&] { w.add("w", v, {2, 2}); }),
             Contains("\"w\": shape [2, 2] of F32 needs 16 bytes, but 12 were given"));
  CHECK_THAT(message_of<invalid_argument>([&] { w.add("__metadata__", v, {3}); }), Contains("reserved"));
  CHECK_THAT(message_of<invalid_argument>([&] { w.add("bad\xff", v, {3}); }), Contains("not valid UTF-8"));
  CHECK_THAT(message_of<invalid_argument>([&] { w.add("huge", v, {1ull << 62, 8}); }), Contains("overflows"));
  CHECK_THAT(message_of<invalid_argument>([&] { w.metadata("format", "np"); }), Contains("\"format\": \"pt\""));
  CHECK_THAT(message_of<invalid_argument>([&] { w.metadata("k", "\xc3"); }), Contains("metadata \"k\"") && Contains("UTF-8"));
  CHECK(w.size() == 1);

  scratch_dir dir;
  const auto target = dir / "missing-dir" / "x.safetensors";
  const auto m = message_of<io::safetensors_error>([&] { w.write(target); });
  CHECK_THAT(m, Contains(target.string()) && Contains("cannot create a temporary file"));
  CHECK(!std::filesystem::exists(target));
  CHECK_THAT(refusal(dir / "absent.safetensors"), Contains("absent.safetensors") && Contains("cannot open"));
}

TEST_CASE("the reader refuses each malformed file, naming the file and the problem", "[safetensors]") {
  scratch_dir dir;
  const std::string a8 = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  struct bad {
    std::string name;
    std::string header;
    std::size_t data;
    std::optional<std::uint64_t> size_field;
    std::string expect;
  };
  const std::vector<bad> cases = {
      {"huge_header", "{" + a8 + "}", 8, 100'000'001, "over the limit of 100000000"},
      {"past_end", "{" + a8 + "}", 8, 4096, "bytes, but only"},
      {"leading_space", " {" + a8 + "}", 8, {}, "does not start with '{'"},
      {"empty_header", "", 0, {}, "does not start with '{'"},
      {"not_json", "{\"a\":", 0, {}, "invalid JSON"},
      {"trailing_garbage", "{" + a8 + "}x", 8, {}, "invalid JSON"},
      {"nul_padding", "{" + a8 + "}" + std::string(3, '\0'), 8, {}, "a NUL byte at header offset 54"},
      {"nul_inside", "{" + a8 + std::string(1, '\0') + ",\"x\":1}", 8, {}, "a NUL byte at header offset 53"},
      {"bad_utf8", "{\"a\xc3\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, {}, "invalid JSON"},
      {"duplicate", "{" + a8 + "," + a8 + "}", 8, {}, "the key \"a\" appears more than once in one object (at the top level)"},
      {"duplicate_nested", R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, {},
       "appears more than once in one object (in a nested object)"},
      {"duplicate_metadata", R"({"__metadata__":{"k":"1","k":"2"},)" + a8 + "}", 8, {}, "the key \"k\" appears more than once"},
      {"entry_array", R"({"a":[1]})", 0, {}, "tensor \"a\": its entry must be an object"},
      {"missing_dtype", R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8, {}, "tensor \"a\": missing field \"dtype\""},
      {"missing_offsets", R"({"a":{"dtype":"F32","shape":[2]}})", 8, {}, "missing field \"data_offsets\""},
      {"unknown_field", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"strides":[1]}})", 8, {},
       "unknown field \"strides\""},
      {"dtype_number", R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8, {}, "\"dtype\" must be a string"},
      {"dtype_unknown", R"({"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", 8, {},
       "dtype \"f32\" is not a safetensors dtype"},
      {"dtype_unsupported", R"({"a":{"dtype":"F4","shape":[16],"data_offsets":[0,8]}})", 8, {},
       "dtype \"F4\" is one etude does not read"},
      {"shape_not_array", R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8, {}, "\"shape\" must be an array"},
      {"shape_negative", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, {},
       "shape[0] is a negative integer"},
      {"shape_float", R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8, {},
       "shape[0] is a non-integer or out-of-range number"},
      {"shape_huge", R"({"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]}})", 8, {},
       "non-integer or out-of-range number"},
      {"shape_string", R"({"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8, {}, "shape[0] is a JSON string"},
      {"offsets_three", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", 8, {},
       "array of two non-negative integers"},
      {"offsets_negative", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8, {},
       "data_offsets[0] is a negative integer"},
      {"offsets_reversed", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", 8, {}, "end before they begin"},
      {"size_mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, {},
       "span 8 bytes, but shape [3] of F32 (4 bytes each) needs 12"},
      {"overflow", R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8, {},
       "overflows 64 bits"},
      {"overflow_bytes", R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8, {},
       "overflows 64 bits"},
      {"beyond_data", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, {},
       "run past the end of the data region (8 bytes)"},
      {"gap_at_start", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, {},
       "bytes [0, 4) of the data region belong to no tensor: a gap before tensor \"a\""},
      {"gap_between", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[2],"data_offsets":[9,11]}})",
       11, {}, "bytes [8, 9) of the data region belong to no tensor: a gap before tensor \"b\""},
      {"overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, {}, "tensor \"b\" (data_offsets [4, 12]) overlaps tensor \"a\", which ends at offset 8"},
      {"same_range", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       8, {}, "overlaps tensor \"a\""},
      {"empty_inside", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
       8, {}, "tensor \"e\" (data_offsets [4, 4]) overlaps tensor \"a\""},
      {"trailing", "{" + a8 + "}", 9, {}, "1 trailing byte(s) after the last tensor"},
      {"data_without_tensors", "{}", 4, {}, "4 trailing byte(s)"},
      {"metadata_array", R"({"__metadata__":["pt"],)" + a8 + "}", 8, {}, "\"__metadata__\" must be an object"},
      {"metadata_null", R"({"__metadata__":null,)" + a8 + "}", 8, {}, "\"__metadata__\" must be an object"},
      {"metadata_number", R"({"__metadata__":{"format":"pt","step":3},)" + a8 + "}", 8, {},
       "\"__metadata__\" value of \"step\" is a JSON number; metadata values must be strings"},
      {"metadata_nested", R"({"__metadata__":{"x":{"y":"z"}},)" + a8 + "}", 8, {}, "value of \"x\" is a JSON object"},
  };
  for (const auto& c : cases) {
    const auto p = dir / (c.name + ".safetensors");
    craft(p, c.header, c.data, c.size_field);
    INFO(c.name);
    const auto m = refusal(p);
    CHECK_THAT(m, Contains(p.string()) && Contains(c.expect));
  }
  // shorter than the size field itself
  write_bytes(dir / "short.safetensors", {1, 0, 0});
  CHECK_THAT(refusal(dir / "short.safetensors"), Contains("short.safetensors: the file is 3 bytes long"));
  write_bytes(dir / "zero.safetensors", {});
  CHECK_THAT(refusal(dir / "zero.safetensors"), Contains("the file is 0 bytes long"));
}

TEST_CASE("files other writers lay out differently are read as long as they follow the format", "[safetensors]") {
  scratch_dir dir;
  // Header not padded (size 61, not a multiple of 8), fields in another order, whitespace inside,
  // tensors listed out of offset order: all legal.
  const std::string header = R"({ "b" : {"data_offsets":[4,12], "shape":[2], "dtype":"F32"}, "a":{"shape":[],"dtype":"I32","data_offsets":[0,4]} }  )";
  std::vector<unsigned char> out(8);
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out.insert(out.end(), header.begin(), header.end());
  const std::int32_t a = -5;
  const float b[2] = {1.5f, 2.5f};
  out.resize(out.size() + 12);
  std::memcpy(out.data() + 8 + n, &a, 4);
  std::memcpy(out.data() + 8 + n + 4, b, 8);
  write_bytes(dir / "other.safetensors", out);

  io::safetensors_file f(dir / "other.safetensors");
  CHECK(f.names() == std::vector<std::string>{"a", "b"});
  CHECK(f.metadata().empty());
  CHECK(f.copy<std::int32_t>("a") == std::vector<std::int32_t>{-5});
  CHECK(f.copy<float>("b") == std::vector<float>{1.5f, 2.5f});
  CHECK(f.to_float("b") == std::vector<float>{1.5f, 2.5f});
  // 8 + n is odd, so the floats are not 4-byte aligned in the mapping: in-place access says so.
  if ((8 + n + 4) % alignof(float) != 0)
    CHECK_THAT(message_of<io::safetensors_error>([&] { (void)f.as<float>("b"); }),
               Contains("not aligned") && Contains("copy<T>()"));
}
