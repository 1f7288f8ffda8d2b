// Condition data into model inputs: vocabularies built from the real chorales' train split (key,
// mode), given explicitly (pitch classes), their JSON round trip and the checks on reading one
// back; the encoder's rules (unknown value: error or null; absent attribute: null) on a loaded
// batch of the chorales; embedding files (float32, float16, masks) read back, and each bad
// embedding input refused with the example and file named and the batch left as it was.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include <etude/core/dtype.hpp>
#include <etude/data/condition_encoder.hpp>
#include <etude/data/loader.hpp>

#include "support.hpp"

using etude::index_t;
namespace data = etude::data;
namespace cond = etude::cond;
namespace fs = std::filesystem;
using etude::test::message_of;

namespace {

const fs::path chorales = fs::path(ETUDE_SOURCE_DIR) / "data" / "chorales";

using key_mode = etude::conditions<cond::attribute<"key", 24>, cond::attribute<"mode", 2>>;
using key_null = etude::conditions<cond::attribute<"key", 24, 8, cond::unknown_value::null>, cond::attribute<"mode", 2>>;
using with_text = etude::conditions<cond::attribute<"mode", 2>, cond::embedding<"text", 3, 4>>;

// Every value of `key` in the shard files of a split, read with the shard reader alone.
std::map<std::string, std::set<std::string>> values_in(const std::string& split) {
  std::map<std::string, std::set<std::string>> out;
  const data::shard_reader r(chorales / (split + "-00000.etok"));
  for (index_t i = 0; i < r.size(); ++i) {
    const auto ex = r.example(i);  // attributes() views into it: keep it alive for the loop
    for (const auto& [k, v] : ex.attributes()) out[std::string(k)].emplace(v);
  }
  return out;
}

data::loader_config chorale_loader(index_t batch) {
  data::loader_config c;
  c.batch_size = batch;
  c.segment_frames = 64;
  c.codebooks = 4;
  c.card = 64;
  c.workers = 0;
  c.shuffle = false;
  c.on_notice = [](const std::string&) {};
  return c;
}

// A one-split dataset of examples with the given conditions (ids "ex<e>"), 8 frames each.
void make_conditioned(const fs::path& dir, const std::vector<data::conditions>& rows) {
  const auto codec = etude::test::test_codec(4, 16);
  data::manifest m;
  m.name = "cond";
  m.version = "1";
  m.codec = codec;
  data::split_entry split{"train", {}};
  data::shard_writer w(dir / "train-0.etok", codec);
  for (std::size_t e = 0; e < rows.size(); ++e)
    w.add("ex" + std::to_string(e), etude::test::example_tokens(4, 8, 16, e), 8, rows[e]);
  const auto sum = w.finalize();
  split.shards.push_back({"train-0.etok", sum.bytes, sum.checksum, sum.examples, sum.frames});
  m.splits.push_back(split);
  m.save(dir / "manifest.json");
}

data::conditions row(const std::string& mode, std::optional<data::embedding_ref> emb = std::nullopt) {
  data::conditions c;
  if (!mode.empty()) c.set("mode", mode);
  c.embedding = std::move(emb);
  return c;
}

// The value at (row, position, i) of the test's embedding files: distinct and exact in float16.
float stored(std::uint64_t r, std::uint64_t p, std::uint64_t i) { return static_cast<float>(r * 16 + p * 4 + i) * 0.25f; }

// text.npy (rows, L, 3) and text.mask.npy (rows, L): row r has r + 1 real positions (capped at L).
void write_embedding(const fs::path& dir, const std::string& stem, std::uint64_t rows, std::uint64_t L,
                     bool half = false, std::uint64_t width = 3) {
  std::vector<float> v;
  std::vector<std::uint16_t> h;
  std::vector<std::uint8_t> m;
  for (std::uint64_t r = 0; r < rows; ++r)
    for (std::uint64_t p = 0; p < L; ++p) {
      m.push_back(p <= r ? 1 : 0);
      for (std::uint64_t i = 0; i < width; ++i) {
        const float x = p <= r ? stored(r, p, i) : 99.0f;  // padding holds garbage on purpose
        v.push_back(x);
        h.push_back(etude::detail::float_to_fp16_bits(x));
      }
    }
  if (half) etude::test::write_npy(dir / (stem + ".npy"), "<f2", {rows, L, width}, h);
  else etude::test::write_npy(dir / (stem + ".npy"), "<f4", {rows, L, width}, v);
  etude::test::write_npy(dir / (stem + ".mask.npy"), "|u1", {rows, L}, m);
}

}  // namespace

TEST_CASE("a vocabulary built from the chorales' train split lists the sorted distinct values", "[conditions]") {
  const data::dataset ds(chorales / "manifest.json");
  const auto split = ds.split("train");
  const auto vocab = data::build_condition_vocab<key_mode>(*split);
  const auto seen = values_in("train");
  REQUIRE(vocab.attributes().size() == 2);
  CHECK(vocab.attributes()[0].name == "key");
  CHECK(vocab.attributes()[1].name == "mode");
  const auto& keys = vocab.attributes()[0].values;
  CHECK(std::set<std::string>(keys.begin(), keys.end()) == seen.at("key"));
  CHECK(std::is_sorted(keys.begin(), keys.end()));
  CHECK(keys.size() >= 10);  // the corpus spans most tonics
  CHECK(vocab.attributes()[1].values == std::vector<std::string>{"major", "minor"});
  // Every chorale's key spelling is one of the 12 pitch classes.
  const auto pcs = data::pitch_class_vocab();
  for (const auto& k : keys) CHECK(pcs.find(k) >= 0);
}

TEST_CASE("pitch classes: 12 values, enharmonic spellings on one index", "[conditions]") {
  const auto v = data::pitch_class_vocab("key");
  CHECK(v.values.size() == 12);
  CHECK(v.find("C") == 0);
  CHECK(v.find("Bb") == 10);
  CHECK(v.find("A#") == 10);
  CHECK(v.find("F#") == v.find("Gb"));
  CHECK(v.find("Cb") == 11);
  CHECK(v.find("B#") == 0);
  CHECK(v.find("E##") == 6);
  CHECK(v.find("H") == -1);
  data::condition_vocab given({v, data::attribute_vocab{"mode", {"major", "minor"}, {}}});
  CHECK_NOTHROW(given.check<key_mode>("given"));
  // a given vocabulary wins over the data
  const data::dataset ds(chorales / "manifest.json");
  const auto built = data::build_condition_vocab<key_mode>(*ds.split("train"), {v});
  CHECK(built.attributes()[0] == v);
}

TEST_CASE("a vocabulary survives JSON and a file, and is checked against the configuration", "[conditions]") {
  etude::test::scratch_dir dir;
  const data::condition_vocab vocab(
      {data::pitch_class_vocab("key"), data::attribute_vocab{"mode", {"major", "minor"}, {}}});
  vocab.save(dir / "vocab.json");
  const auto back = data::condition_vocab::load<key_mode>(dir / "vocab.json");
  CHECK(back == vocab);
  CHECK(back.attributes()[0].find("A#") == 10);
  CHECK(data::condition_vocab::from_json(vocab.to_json(), "json") == vocab);

  // another configuration: too few values, other names, another order
  using few = etude::conditions<cond::attribute<"key", 8>, cond::attribute<"mode", 2>>;
  CHECK_THAT(message_of<etude::invalid_input>([&] { (void)data::condition_vocab::load<few>(dir / "vocab.json"); }),
             Catch::Contains("attribute 'key' has 12 values but cond::attribute<\"key\", 8> takes at most 8") &&
                 Catch::Contains("vocab.json"));
  using other = etude::conditions<cond::attribute<"key", 24>, cond::attribute<"meter", 2>>;
  CHECK_THAT(message_of<etude::invalid_input>([&] { back.check<other>("v"); }),
             Catch::Contains("has attributes (key, mode) but the model's conditions have (key, meter)"));
  using swapped = etude::conditions<cond::attribute<"mode", 2>, cond::attribute<"key", 24>>;
  CHECK_THROWS_AS(back.check<swapped>("v"), etude::invalid_input);

  // damaged files
  etude::test::write_bytes(dir / "bad.json", {'{', '}'});
  CHECK_THAT(message_of([&] { (void)data::condition_vocab::load(dir / "bad.json"); }),
             Catch::Contains("bad.json: field format"));
  auto j = vocab.to_json();
  j["attributes"][0]["aliases"]["A#"] = 12;
  CHECK_THAT(message_of([&] { (void)data::condition_vocab::from_json(j, "v.json"); }),
             Catch::Contains("attributes[0].aliases.A#"));
  j = vocab.to_json();
  j["attributes"][1]["values"] = {"major", "major"};
  const auto twice = data::condition_vocab::from_json(j, "v.json");
  CHECK_THAT(message_of<etude::invalid_input>([&] { twice.check<key_mode>("v.json"); }),
             Catch::Contains("lists the value \"major\" twice"));
}

TEST_CASE("more distinct values than the configuration takes are refused, naming attribute, count and fix",
          "[conditions]") {
  using small = etude::conditions<cond::attribute<"key", 5>, cond::attribute<"mode", 2>>;
  const data::dataset ds(chorales / "manifest.json");
  const auto n = values_in("train").at("key").size();
  const auto msg = message_of<etude::invalid_input>([&] { (void)data::build_condition_vocab<small>(*ds.split("train")); });
  CHECK_THAT(msg, Catch::Contains("attribute 'key' has " + std::to_string(n) + " distinct values in split \"train\"") &&
                      Catch::Contains("cond::attribute<\"key\", 5>") &&
                      Catch::Contains("raise Values to " + std::to_string(n)));
  using missing = etude::conditions<cond::attribute<"genre", 5>>;
  CHECK_THAT(message_of<etude::invalid_input>([&] { (void)data::build_condition_vocab<missing>(*ds.split("train")); }),
             Catch::Contains("attribute 'genre' occurs in no example"));
}

TEST_CASE("the encoder fills a loaded chorale batch through the vocabulary", "[conditions][loader]") {
  const data::dataset ds(chorales / "manifest.json");
  const auto vocab = data::build_condition_vocab<key_mode>(*ds.split("train"));
  const data::condition_encoder<key_mode> enc(vocab, ds);
  data::loader l(ds.split("train"), chorale_loader(6));
  auto b = l.next().value();
  REQUIRE(b.batch == 6);
  CHECK(b.attributes.empty());
  enc.encode(b);
  REQUIRE(b.attributes.size() == 12);
  CHECK(b.embeddings.empty());
  CHECK(b.embedding_mask.empty());
  for (std::size_t r = 0; r < 6; ++r) {
    for (int a = 0; a < 2; ++a) {
      const auto& v = vocab.attributes()[static_cast<std::size_t>(a)];
      const std::string* s = b.conditions[r].attribute(v.name);
      REQUIRE(s != nullptr);
      const auto i = b.attributes[r * 2 + static_cast<std::size_t>(a)];
      INFO(b.ids[r] << " " << v.name << " = " << *s);
      REQUIRE(i >= 0);
      CHECK(v.values[static_cast<std::size_t>(i)] == *s);
    }
  }
  // the batch view carries them to a trainer
  const etude::batch_view view = b.view();
  CHECK(view.attributes == b.attributes.data());
  CHECK(view.attributes_size == 12);
}

TEST_CASE("unknown values: error names example, attribute, value and known values; null policy gives -1",
          "[conditions]") {
  const data::condition_vocab vocab({data::attribute_vocab{"key", {"C", "G"}, {}}, {"mode", {"major", "minor"}, {}}});
  std::vector<data::conditions> rows(3);
  rows[0].set("key", "G");
  rows[0].set("mode", "minor");
  rows[1].set("key", "F#");  // unknown
  rows[1].set("mode", "major");
  rows[2].set("mode", "major");  // no key at all
  const std::vector<std::string> ids = {"a", "b", "c"};

  const data::condition_encoder<key_mode> strict(vocab, fs::path("."));
  CHECK_THAT(message_of<etude::invalid_input>([&] { (void)strict.encode(rows, ids, 3); }),
             Catch::Contains("example b: attribute 'key' has the value \"F#\"") && Catch::Contains("known: C, G") &&
                 Catch::Contains("cond::unknown_value::null"));

  const data::condition_encoder<key_null> lenient(vocab, fs::path("."));
  const auto e = lenient.encode(rows, ids, 4);  // a fourth, padding row
  CHECK(e.attributes == std::vector<std::int32_t>{1, 1, -1, 0, -1, 0, -1, -1});

  // an absent attribute is null under either policy
  rows[1].set("key", "C");
  CHECK(strict.encode(rows, ids, 3).attributes == std::vector<std::int32_t>{1, 1, 0, 0, -1, 0});
  // a batch left as it was after a refusal
  data::loaded_batch b(2, 4, 8);
  b.ids = {"x", "y"};
  b.conditions = {rows[0], rows[0]};
  b.conditions[1].set("key", "Db");
  b.attributes = {7, 7, 7, 7};
  CHECK_THROWS_AS(strict.encode(b), etude::invalid_input);
  CHECK(b.attributes == std::vector<std::int32_t>{7, 7, 7, 7});
  // an encoder refuses a vocabulary made for another configuration
  CHECK_THROWS_AS(data::condition_encoder<with_text>(vocab, fs::path(".")), etude::invalid_input);
}

TEST_CASE("embedding files are read back: float32 and float16, width, length, mask, padding zeroed",
          "[conditions][embedding]") {
  for (const bool half : {false, true}) {
    INFO((half ? "float16" : "float32"));
    etude::test::scratch_dir dir;
    fs::create_directories(dir / "emb");
    write_embedding(dir / "emb", "text", 3, 4, half);  // rows 0..2 with 1..3 real positions of 4
    make_conditioned(dir.path(), {row("major", data::embedding_ref{"emb/text.npy", 2}), row("minor"),
                                  row("", data::embedding_ref{"emb/text.npy", 0})});
    const data::dataset ds(dir / "manifest.json");
    const data::condition_vocab vocab({data::attribute_vocab{"mode", {"major", "minor"}, {}}});
    const data::condition_encoder<with_text> enc(vocab, ds);
    data::loader_config c = chorale_loader(3);
    c.segment_frames = 8;
    c.card = 16;
    data::loader l(ds.split("train"), c);
    auto b = l.next().value();
    enc.encode(b);
    REQUIRE(b.attributes == std::vector<std::int32_t>{0, 1, -1});
    REQUIRE(b.embeddings.size() == 3u * 4 * 3);
    REQUIRE(b.embedding_mask == std::vector<unsigned char>{1, 1, 1, 0, /* null */ 0, 0, 0, 0, 1, 0, 0, 0});
    auto at = [&](std::size_t r, std::size_t p, std::size_t i) { return b.embeddings[(r * 4 + p) * 3 + i]; };
    for (std::size_t p = 0; p < 4; ++p)
      for (std::size_t i = 0; i < 3; ++i) {
        CHECK(at(0, p, i) == (p < 3 ? stored(2, p, i) : 0.0f));  // values exact in float16 too
        CHECK(at(1, p, i) == 0.0f);
        CHECK(at(2, p, i) == (p < 1 ? stored(0, p, i) : 0.0f));
      }
    const auto v = b.view();
    CHECK(v.embeddings_size == 36);
    CHECK(v.embedding_mask_size == 12);
  }
}

TEST_CASE("embeddings shorter or longer than max_len: padded; refused or truncated past it", "[conditions][embedding]") {
  etude::test::scratch_dir dir;
  write_embedding(dir.path(), "short", 2, 2);  // L = 2 < max_len 4
  write_embedding(dir.path(), "long", 6, 6);   // L = 6 > 4; row 2 has 3 real positions, row 5 has 6
  const data::condition_vocab vocab({data::attribute_vocab{"mode", {"major", "minor"}, {}}});
  const std::vector<std::string> ids = {"piece/one"};
  auto one = [&](const std::string& file, std::uint64_t r) {
    return std::vector<data::conditions>{row("major", data::embedding_ref{file, r})};
  };
  const data::condition_encoder<with_text> enc(vocab, dir.path());
  CHECK(enc.encode(one("short.npy", 1), ids, 1).embedding_mask == std::vector<unsigned char>{1, 1, 0, 0});
  // a long file whose row is short enough is fine
  CHECK(enc.encode(one("long.npy", 2), ids, 1).embedding_mask == std::vector<unsigned char>{1, 1, 1, 0});
  CHECK_THAT(message_of([&] { (void)enc.encode(one("long.npy", 5), ids, 1); }),
             Catch::Contains("embedding 'text' of example piece/one") && Catch::Contains("has 6 real positions") &&
                 Catch::Contains("embedding_options::truncate"));
  const data::condition_encoder<with_text> cut(vocab, dir.path(), data::embedding_options{.truncate = true});
  const auto e = cut.encode(one("long.npy", 5), ids, 1);
  CHECK(e.embedding_mask == std::vector<unsigned char>{1, 1, 1, 1});
  CHECK(e.embeddings[3 * 3 + 2] == stored(5, 3, 2));
}

TEST_CASE("bad embedding input is refused naming example, condition and file; nothing half-filled",
          "[conditions][embedding]") {
  etude::test::scratch_dir dir;
  write_embedding(dir.path(), "text", 3, 4);
  write_embedding(dir.path(), "wide", 3, 4, false, 5);
  // non-finite value at a real position
  {
    std::vector<float> v(3 * 4 * 3, 1.0f);
    v[(1 * 4 + 0) * 3 + 2] = std::numeric_limits<float>::quiet_NaN();
    etude::test::write_npy(dir / "nan.npy", "<f4", {3, 4, 3}, v);
    etude::test::write_npy(dir / "nan.mask.npy", "|u1", {3, 4}, std::vector<std::uint8_t>(12, 1));
  }
  // a NaN at a padded position is never read
  {
    std::vector<float> v(1 * 4 * 3, 1.0f);
    v.back() = std::numeric_limits<float>::infinity();
    etude::test::write_npy(dir / "padnan.npy", "<f4", {1, 4, 3}, v);
    etude::test::write_npy(dir / "padnan.mask.npy", "|b1", {1, 4}, std::vector<std::uint8_t>{1, 1, 0, 0});
  }
  etude::test::write_npy(dir / "nomask.npy", "<f4", {1, 4, 3}, std::vector<float>(12, 0.5f));
  etude::test::write_npy(dir / "f64.npy", "<f8", {1, 4, 3}, std::vector<double>(12, 0.5));
  etude::test::write_npy(dir / "f64.mask.npy", "|u1", {1, 4}, std::vector<std::uint8_t>(4, 1));
  etude::test::write_npy(dir / "flat.npy", "<f4", {4, 3}, std::vector<float>(12, 0.5f));
  etude::test::write_npy(dir / "flat.mask.npy", "|u1", {1, 4}, std::vector<std::uint8_t>(4, 1));
  etude::test::write_npy(dir / "skew.npy", "<f4", {1, 4, 3}, std::vector<float>(12, 0.5f));
  etude::test::write_npy(dir / "skew.mask.npy", "|u1", {1, 3}, std::vector<std::uint8_t>(3, 1));
  etude::test::write_npy(dir / "two.npy", "<f4", {1, 4, 3}, std::vector<float>(12, 0.5f));
  etude::test::write_npy(dir / "two.mask.npy", "|u1", {1, 4}, std::vector<std::uint8_t>{1, 2, 0, 0});
  etude::test::write_npy(dir / "cut.npy", "<f4", {2, 4, 3}, std::vector<float>(12, 0.5f));  // 24 announced
  etude::test::write_npy(dir / "cut.mask.npy", "|u1", {2, 4}, std::vector<std::uint8_t>(8, 1));

  const data::condition_vocab vocab({data::attribute_vocab{"mode", {"major", "minor"}, {}}});
  const data::condition_encoder<with_text> enc(vocab, dir.path());
  const std::vector<std::string> ids = {"bach/bwv1.6.mxl", "bach/bwv10.7.mxl"};
  auto refused = [&](const std::string& file, std::uint64_t r, const std::string& says) {
    INFO(file << " row " << r);
    // the first row is fine, the second one bad: a loaded batch keeps what it had
    data::loaded_batch b(2, 4, 8);
    b.ids = ids;
    b.conditions = {row("major", data::embedding_ref{"text.npy", 0}), row("minor", data::embedding_ref{file, r})};
    b.attributes = {5, 5, 5, 5};
    const auto msg = message_of([&] { enc.encode(b); });
    CHECK_THAT(msg, Catch::Contains("embedding 'text' of example bach/bwv10.7.mxl") && Catch::Contains(says));
    CHECK(b.attributes == std::vector<std::int32_t>{5, 5, 5, 5});
    CHECK(b.embeddings.empty());
    CHECK(b.embedding_mask.empty());
  };
  refused("wide.npy", 0, "wide.npy has width 5, the model takes 3");
  refused("missing.npy", 0, "missing.npy does not exist");
  refused("nomask.npy", 0, "nomask.mask.npy for embedding file");
  refused("text.npy", 3, "row 3 is out of range, file " + (dir / "text.npy").string() + " has 3 rows");
  refused("nan.npy", 1, "position 0, value 2 is not finite");
  refused("f64.npy", 0, "expected float32 or float16 (rows, max_len, width)");
  refused("flat.npy", 0, "expected float32 or float16 (rows, max_len, width)");
  refused("skew.npy", 0, "has shape (1, 3) but embedding file");
  refused("two.npy", 0, "holds 2; a mask holds 0 (padding) or 1 (real)");
  refused("cut.npy", 0, "truncated");
  refused("../text.npy", 0, "is not a path inside the dataset directory");
  refused((dir / "text.npy").string(), 0, "is not a path inside the dataset directory");

  const std::vector<data::conditions> ok = {row("major", data::embedding_ref{"padnan.npy", 0})};
  const auto e = enc.encode(ok, std::vector<std::string>{"x"}, 1);
  CHECK(e.embedding_mask == std::vector<unsigned char>{1, 1, 0, 0});
  CHECK(std::all_of(e.embeddings.begin(), e.embeddings.end(), [](float x) { return std::isfinite(x); }));
}
