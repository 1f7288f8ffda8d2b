// Token shards: the layout round-trips tokens and conditions for both token widths, the checksum is
// XXH64 as documented, 64-bit offsets address beyond 4 GiB, and every corruption a copy or a disk
// can produce (truncation, wrong magic or version, flipped bytes, bad index) is refused by name.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <functional>

#include <etude/core/detail/xxhash64.hpp>
#include <etude/data/shard_format.hpp>
#include <etude/data/shard_reader.hpp>
#include <etude/data/shard_writer.hpp>

#include "support.hpp"

using etude::index_t;
using etude::token_t;
namespace data = etude::data;
namespace fmt = etude::data::shard_format;
using etude::test::message_of;
using etude::test::scratch_dir;

namespace {

// A finished shard of three examples (lengths 5, 64, 17) for corruption tests.
data::shard_summary small_shard(const std::filesystem::path& p, int card = 2048) {
  data::shard_writer w(p, etude::test::test_codec(4, card));
  const index_t lengths[] = {5, 64, 17};
  for (std::uint64_t e = 0; e < 3; ++e)
    w.add("id" + std::to_string(e), etude::test::example_tokens(4, lengths[e], card, e), lengths[e]);
  return w.finalize();
}

}  // namespace

TEST_CASE("XXH64 matches the reference values", "[shard][hash]") {
  using h = etude::detail::xxhash64;
  CHECK(h::of("", 0) == 0xef46db3751d8e999ULL);
  CHECK(h::of("abc", 3) == 0x44bc2cf5ad770999ULL);
  const std::string long_text = "etude token shards: 32+ bytes so the stripe loop runs";
  CHECK(h::of(long_text.data(), long_text.size()) == 0x1bf5a2917221afeaULL);
  std::vector<unsigned char> bytes(100);
  for (int i = 0; i < 100; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<unsigned char>(i);
  CHECK(h::of(bytes.data(), bytes.size()) == 0x6ac1e58032166597ULL);
  // streaming in uneven pieces gives the one-shot value
  h s;
  for (std::size_t at = 0; at < bytes.size(); at += 7) s.update(bytes.data() + at, std::min<std::size_t>(7, 100 - at));
  CHECK(s.digest() == 0x6ac1e58032166597ULL);
}

TEST_CASE("token width follows the card, counting the special token", "[shard]") {
  STATIC_REQUIRE(fmt::token_bytes_for_card(2048) == 2);
  STATIC_REQUIRE(fmt::token_bytes_for_card(65535) == 2);  // ids 0..65534 and special 65535 fit
  STATIC_REQUIRE(fmt::token_bytes_for_card(65536) == 4);
}

TEST_CASE("a shard round-trips tokens, ids and conditions", "[shard]") {
  const int card = GENERATE(2048, 70000);  // uint16 and uint32 storage
  scratch_dir dir;
  const auto path = dir / "a.etok";
  const int K = 3;
  const index_t lengths[] = {1, 50, 333, 64};
  std::vector<data::conditions> conds(4);
  conds[0].set("key", "C");
  conds[0].set("mode", "major");
  conds[0].set("genre", "jazz");
  conds[0].caption = "a quiet piano piece";
  conds[1].embedding = data::embedding_ref{"clap/train.npy", 12345678901ULL};
  conds[2].caption = "";  // present but empty is not the same as absent
  conds[2].set("tempo", "fast");
  data::shard_summary sum;
  {
    data::shard_writer w(path, etude::test::test_codec(K, card));
    for (std::uint64_t e = 0; e < 4; ++e) {
      auto tokens = etude::test::example_tokens(K, lengths[e], card, e);
      tokens[0] = card - 1;  // the largest id must survive the narrow type
      w.add("piece-" + std::to_string(e), tokens, lengths[e], conds[e]);
    }
    CHECK(w.size() == 4);
    sum = w.finalize();
  }
  CHECK(sum.examples == 4);
  CHECK(sum.frames == 1 + 50 + 333 + 64);
  CHECK(sum.bytes == std::filesystem::file_size(path));

  const data::shard_reader r(path);
  CHECK(r.header().token_bytes == fmt::token_bytes_for_card(card));
  CHECK(r.size() == 4);
  CHECK(r.codebooks() == K);
  CHECK(r.card() == card);
  CHECK(r.frame_rate() == 50.0);
  CHECK(r.codec_name() == "testcodec");
  CHECK(r.codec_version() == "1.0");
  CHECK(r.checksum() == sum.checksum);
  for (std::uint64_t e = 0; e < 4; ++e) {
    const auto ex = r.example(static_cast<index_t>(e));
    auto tokens = etude::test::example_tokens(K, lengths[e], card, e);
    tokens[0] = card - 1;
    REQUIRE(ex.frames() == lengths[e]);
    CHECK(ex.codebooks() == K);
    CHECK(ex.id() == "piece-" + std::to_string(e));
    bool same = true;
    for (int k = 0; k < K; ++k)
      for (index_t t = 0; t < lengths[e]; ++t) same = same && ex.token(k, t) == tokens[static_cast<std::size_t>(k * lengths[e] + t)];
    CHECK(same);
    std::vector<token_t> part(static_cast<std::size_t>(lengths[e]));
    ex.copy(K - 1, 0, lengths[e], part.data());
    CHECK(std::equal(part.begin(), part.end(), tokens.begin() + (K - 1) * lengths[e]));
    CHECK(ex.owned_conditions() == conds[e]);
  }
  const auto ex0 = r.example(0);
  CHECK(ex0.attribute("genre") == "jazz");
  CHECK_FALSE(ex0.attribute("tempo"));
  CHECK(ex0.caption() == "a quiet piano piece");
  CHECK_FALSE(r.example(1).caption());
  CHECK(r.example(1).embedding()->row == 12345678901ULL);
  CHECK(r.example(2).caption() == "");
  CHECK_THROWS_AS(r.example(4), etude::invalid_argument);
}

TEST_CASE("the checksum is XXH64 over payload and index, then the header with the field zeroed", "[shard]") {
  scratch_dir dir;
  const auto sum = small_shard(dir / "s.etok");
  auto bytes = etude::test::read_bytes(dir / "s.etok");
  const std::uint32_t header_bytes = fmt::detail::get32(bytes.data() + 12);
  etude::detail::xxhash64 h;
  h.update(bytes.data() + header_bytes, bytes.size() - header_bytes);
  std::memset(bytes.data() + 80, 0, 8);
  h.update(bytes.data(), header_bytes);
  CHECK(h.digest() == sum.checksum);
  CHECK(fmt::detail::get64(etude::test::read_bytes(dir / "s.etok").data() + 80) == sum.checksum);
}

TEST_CASE("the writer refuses bad examples and leaves the shard consistent", "[shard]") {
  scratch_dir dir;
  const auto path = dir / "w.etok";
  data::shard_writer w(path, etude::test::test_codec(2, 16));
  std::vector<token_t> ok = {1, 2, 3, 4, 5, 6};
  w.add("a", ok, 3);

  std::vector<token_t> high = {1, 2, 3, 4, 16, 6};
  const auto m = message_of([&] { w.add("b", high, 3); });
  CHECK_THAT(m, Catch::Contains("w.etok") && Catch::Contains("example 1") && Catch::Contains("id \"b\"") &&
                    Catch::Contains("token 16 at codebook 1, frame 1") && Catch::Contains("[0, 16)"));
  std::vector<token_t> negative = {1, -1, 3, 4, 5, 6};
  CHECK_THROWS_WITH(w.add("b", negative, 3), Catch::Contains("token -1 at codebook 0, frame 1"));
  CHECK_THROWS_WITH(w.add("b", ok, 4), Catch::Contains("K x T = 2 x 4"));
  CHECK_THROWS_WITH(w.add("b", std::vector<token_t>{}, 0), Catch::Contains("non-empty"));
  CHECK_THROWS_WITH(w.add("", ok, 3), Catch::Contains("field id"));
  CHECK_THROWS_WITH(w.add("a", ok, 3), Catch::Contains("duplicate"));
  data::conditions unsorted;
  unsorted.attributes = {{"mode", "x"}, {"key", "y"}};
  CHECK_THROWS_WITH(w.add("b", ok, 3, unsorted), Catch::Contains("sorted"));
  // a refused id is still free
  std::vector<std::int64_t> wide = {0, 15, 0, 15, 0, 15};
  w.add("b", wide, 3);
  const auto sum = w.finalize();
  CHECK(sum.examples == 2);
  const data::shard_reader r(path);
  CHECK(r.example(1).id() == "b");
  CHECK(r.example(1).token(1, 2) == 15);
  CHECK_THROWS_AS(w.add("c", ok, 3), etude::invalid_argument);
}

TEST_CASE("an unfinished shard leaves no file behind", "[shard]") {
  scratch_dir dir;
  {
    data::shard_writer w(dir / "never.etok", etude::test::test_codec());
    w.add("a", etude::test::example_tokens(4, 10, 2048, 0), 10);
    CHECK(std::distance(std::filesystem::directory_iterator(dir.path()), {}) == 1);  // the hidden temporary
  }
  CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("corrupt shards are refused with the file and the reason", "[shard][bad_input]") {
  scratch_dir dir;
  const auto good = dir / "good.etok";
  small_shard(good);
  const auto bytes = etude::test::read_bytes(good);
  const auto bad = dir / "bad.etok";
  auto open = [&](data::verify v = data::verify::checksum) { return message_of([&] { data::shard_reader r(bad, v); }); };

  SECTION("truncated") {
    etude::test::write_bytes(bad, {bytes.begin(), bytes.end() - 1});
    CHECK_THAT(open(), Catch::Contains("bad.etok") && Catch::Contains("truncated") &&
                           Catch::Contains(std::to_string(bytes.size() - 1)));
    etude::test::write_bytes(bad, {bytes.begin(), bytes.begin() + 40});
    CHECK_THAT(open(), Catch::Contains("truncated"));
    etude::test::write_bytes(bad, {});
    CHECK_THAT(open(), Catch::Contains("truncated"));
  }
  SECTION("wrong magic") {
    auto b = bytes;
    b[0] = 'X';
    etude::test::write_bytes(bad, b);
    CHECK_THAT(open(), Catch::Contains("bad.etok") && Catch::Contains("magic"));
  }
  SECTION("unknown version") {
    auto b = bytes;
    b[8] = 2;
    etude::test::write_bytes(bad, b);
    CHECK_THAT(open(), Catch::Contains("version 2") && Catch::Contains("re-pack"));
  }
  SECTION("a flipped payload byte fails the checksum, not the structure") {
    auto b = bytes;
    b[fmt::detail::get32(b.data() + 12) + 3] ^= 0x01;
    etude::test::write_bytes(bad, b);
    CHECK_THAT(open(), Catch::Contains("bad.etok") && Catch::Contains("checksum mismatch"));
    CHECK(open(data::verify::structure) == "(no matching error thrown)");
  }
  SECTION("a flipped header byte fails the checksum") {
    auto b = bytes;
    b[fmt::fixed_header_bytes] ^= 0x20;  // first byte of the codec name
    etude::test::write_bytes(bad, b);
    CHECK_THAT(open(), Catch::Contains("checksum mismatch"));
  }
  SECTION("a card that disagrees with the token width") {
    auto b = bytes;
    fmt::detail::put32(b.data() + 20, 70000);
    etude::test::write_bytes(bad, b);
    CHECK_THAT(open(data::verify::structure), Catch::Contains("token_bytes"));
  }
  SECTION("an index entry pointing outside the payload names the example") {
    auto b = bytes;
    const std::uint64_t index = fmt::detail::get64(b.data() + 64);
    fmt::detail::put64(b.data() + index + 32 + 8, 1ull << 40);  // example 1: absurd frame count
    etude::test::write_bytes(bad, b);
    CHECK_THAT(open(data::verify::structure), Catch::Contains("example 1") && Catch::Contains("outside the payload"));
  }
  SECTION("a damaged metadata record names the example and field") {
    auto b = bytes;
    const std::uint64_t index = fmt::detail::get64(b.data() + 64);
    const std::uint64_t meta = fmt::detail::get64(b.data() + index + 2 * 32 + 16);
    fmt::detail::put32(b.data() + meta + 4, 1000);  // example 2: id longer than its record
    etude::test::write_bytes(bad, b);
    const data::shard_reader r(bad, data::verify::structure);
    CHECK_THAT(message_of([&] { (void)r.example(2); }),
               Catch::Contains("bad.etok: example 2") && Catch::Contains("field id"));
    CHECK(r.example(0).id() == "id0");
  }
  SECTION("a missing file") {
    CHECK_THAT(message_of([&] { data::shard_reader r(dir / "absent.etok"); }),
               Catch::Contains("absent.etok") && Catch::Contains("No such file"));
  }
}

TEST_CASE("offsets are 64-bit: index arithmetic beyond 4 GiB", "[shard][large]") {
  fmt::header h;
  h.codebooks = 4;
  h.token_bytes = 2;
  h.payload_offset = 128;
  h.index_offset = (6ull << 30) + 64;  // a 6 GiB payload
  fmt::index_entry e{(5ull << 30) + 128, 100000, (6ull << 30), 64};
  CHECK(fmt::entry_fits(h, e));
  CHECK(fmt::token_offset(e, 3, 99999, 2) == (5ull << 30) + 128 + (3ull * 100000 + 99999) * 2);
  // a single example of more than 4 GiB of tokens
  fmt::index_entry huge{256, (1ull << 30), (6ull << 30), 64};  // 4 x 2^30 frames x 2 bytes = 8 GiB
  CHECK_FALSE(fmt::entry_fits(h, huge));
  h.index_offset = (9ull << 30);
  huge.meta_offset = h.index_offset - 64;
  CHECK(fmt::entry_fits(h, huge));
  CHECK(fmt::token_offset(huge, 3, (1ull << 30) - 1, 2) == 256 + ((4ull << 30) - 1) * 2);
  // hostile values wrap nothing
  fmt::index_entry wrap{~0ull - 10, ~0ull / 2, 128, 1};
  CHECK_FALSE(fmt::entry_fits(h, wrap));
  wrap = {256, ~0ull / 4 + 1, 128, 1};
  CHECK_FALSE(fmt::entry_fits(h, wrap));
}

TEST_CASE("a sparse shard with an example beyond 4 GiB reads back", "[shard][large]") {
  // Written by hand from docs/token-shards.md (an independent writer), with a hole of 4.5 GiB before
  // the example, so the reader's real offsets pass 2^32. Checked structurally: hashing 4.5 GiB
  // of zeros would dominate the suite's time.
  scratch_dir dir;
  const auto path = dir / "sparse.etok";
  const int K = 2;
  const std::uint64_t T = 3;
  fmt::header h;
  h.codebooks = K;
  h.card = 2048;
  h.token_bytes = 2;
  h.frame_rate = 50;
  h.example_count = 1;
  h.total_frames = T;
  h.codec_name = "c";
  h.codec_version = "v";
  h.header_bytes = static_cast<std::uint32_t>(fmt::header_bytes_for(1, 1));
  h.payload_offset = h.header_bytes;
  const std::uint64_t tokens_at = (9ull << 29);  // 4.5 GiB
  const std::vector<std::uint16_t> tokens = {7, 2047, 0, 1, 1000, 3};
  data::conditions none;
  const auto meta = fmt::encode_meta("far", none);
  const std::uint64_t meta_at = tokens_at + tokens.size() * 2;
  h.index_offset = fmt::align_up(meta_at + meta.size(), 8);
  h.file_bytes = h.index_offset + fmt::index_entry_bytes;
  unsigned char entry[fmt::index_entry_bytes];
  fmt::encode(fmt::index_entry{tokens_at, T, meta_at, meta.size()}, entry);
  const auto head = fmt::encode(h);

  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  bool written = ::pwrite(fd, head.data(), head.size(), 0) == static_cast<ssize_t>(head.size()) &&
                 ::pwrite(fd, tokens.data(), 12, static_cast<off_t>(tokens_at)) == 12 &&
                 ::pwrite(fd, meta.data(), meta.size(), static_cast<off_t>(meta_at)) == static_cast<ssize_t>(meta.size()) &&
                 ::pwrite(fd, entry, sizeof entry, static_cast<off_t>(h.index_offset)) == static_cast<ssize_t>(sizeof entry);
  ::close(fd);
  if (!written) {
    WARN("the scratch file system refuses a sparse 4.5 GiB file; only the offset arithmetic was checked");
    return;
  }
  const data::shard_reader r(path, data::verify::structure);
  REQUIRE(r.size() == 1);
  const auto ex = r.example(0);
  CHECK(ex.id() == "far");
  CHECK(ex.frames() == 3);
  CHECK(ex.token(0, 0) == 7);
  CHECK(ex.token(0, 1) == 2047);
  CHECK(ex.token(1, 1) == 1000);
  CHECK(ex.token(1, 2) == 3);
}
