// The packer: .npy codes of every integer dtype and JSONL metadata → shards and manifest → the
// loader, exactly; splits decided by group and seed; every bad input rejected with its reason and
// counted; and the pack_tokens tool's exit codes.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>

#include <etude/data/dataset.hpp>
#include <etude/data/loader.hpp>
#include <etude/data/pack.hpp>

#include <etude/core/detail/path_name.hpp>

#include "support.hpp"

using etude::index_t;
namespace data = etude::data;
using etude::test::scratch_dir;
using etude::test::write_npy;

namespace {

// Input example e: K = 4, 30 + 3e frames, ids in [0, 2048); dtype cycles through the five
// integer types NumPy users save codes as, and the .npy version through 1, 2, 3.
std::vector<std::int64_t> codes_of(int e) {
  const auto t = etude::test::example_tokens(4, 30 + 3 * e, 2048, 1000 + static_cast<std::uint64_t>(e));
  return {t.begin(), t.end()};
}

void write_input(const std::filesystem::path& dir, int e) {
  const auto v = codes_of(e);
  const std::vector<std::uint64_t> shape = {4, static_cast<std::uint64_t>(30 + 3 * e)};
  const auto p = dir / ("clip" + std::to_string(100 + e) + ".npy");
  const int major = 1 + e % 3;
  switch (e % 5) {
    case 0: write_npy(p, "<i2", shape, std::vector<std::int16_t>(v.begin(), v.end()), major); break;
    case 1: write_npy(p, "<i4", shape, std::vector<std::int32_t>(v.begin(), v.end()), major); break;
    case 2: write_npy(p, "<i8", {1, 4, shape[1]}, v, major); break;
    case 3: write_npy(p, "<u2", shape, std::vector<std::uint16_t>(v.begin(), v.end()), major); break;
    default: write_npy(p, "<u4", shape, std::vector<std::uint32_t>(v.begin(), v.end()), major); break;
  }
}

data::pack_options options(const scratch_dir& dir) {
  data::pack_options o;
  o.input = dir / "in";
  o.output = dir / "out";
  o.name = "clips";
  o.version = "1";
  o.codec = {.name = "encodec_32khz", .version = "1", .codebooks = 0, .card = 2048, .frame_rate = 50, .sample_rate = 32000};
  o.seed = 3;
  o.shard_examples = 4;
  return o;
}

void write_lines(const std::filesystem::path& p, const std::vector<std::string>& lines) {
  std::ofstream out(p);
  for (const auto& l : lines) out << l << "\n";
}

}  // namespace

TEST_CASE("pack, open, load: every dtype round-trips with its conditions", "[pack]") {
  scratch_dir dir;
  std::filesystem::create_directories(dir / "in");
  const int n = 20;
  std::vector<std::string> meta;
  for (int e = 0; e < n; ++e) {
    write_input(dir / "in", e);
    meta.push_back(nlohmann::json{{"file", "clip" + std::to_string(100 + e) + ".npy"},
                                  {"id", "piece" + std::to_string(e / 2) + "-part" + std::to_string(e % 2)},
                                  {"caption", "clip number " + std::to_string(e)},
                                  {"attributes", {{"key", e % 2 ? "A" : "C"}, {"bpm", 90 + e}}},
                                  {"group", "piece" + std::to_string(e / 2)},
                                  {"embedding", {{"file", "clap.npy"}, {"row", e}}}}
                       .dump());
  }
  write_lines(dir / "meta.jsonl", meta);
  auto o = options(dir);
  o.metadata = dir / "meta.jsonl";
  o.split_ratios = {0.6, 0.2, 0.2};
  const auto report = data::pack_directory(o);
  CHECK(report.inputs == n);
  CHECK(report.packed == n);
  CHECK(report.rejected.empty());
  CHECK(report.result.codec.codebooks == 4);
  CHECK_FALSE(std::filesystem::exists(dir / "out" / "rejected.jsonl"));

  const data::dataset ds(dir / "out" / "manifest.json");
  std::map<std::string, std::string> split_of_piece;
  std::uint64_t total = 0;
  for (const auto& sp : ds.description().splits) {
    const auto split = ds.split(sp.name);
    total += static_cast<std::uint64_t>(split->size());
    for (const auto& sh : sp.shards) CHECK(sh.examples <= 4);
    for (index_t i = 0; i < split->size(); ++i) {
      const auto ex = split->example(i);
      const std::string id(ex.id());
      const int e = std::stoi(id.substr(5, id.find('-') - 5)) * 2 + (id.back() - '0');
      INFO(id);
      const auto want = codes_of(e);
      REQUIRE(ex.frames() == 30 + 3 * e);
      bool same = true;
      for (int k = 0; k < 4; ++k)
        for (index_t t = 0; t < ex.frames(); ++t) same = same && ex.token(k, t) == want[static_cast<std::size_t>(k * ex.frames() + t)];
      CHECK(same);
      CHECK(ex.caption() == "clip number " + std::to_string(e));
      CHECK(ex.attribute("key") == (e % 2 ? "A" : "C"));
      CHECK(ex.attribute("bpm") == std::to_string(90 + e));
      CHECK(ex.embedding()->row == static_cast<std::uint64_t>(e));
      // both parts of a piece share a split
      const std::string piece = id.substr(0, id.find('-'));
      const auto [it, fresh] = split_of_piece.emplace(piece, sp.name);
      CHECK(it->second == sp.name);
    }
  }
  CHECK(total == n);

  // and through the loader: rows are the packed codes
  data::loader_config c;
  c.batch_size = 3;
  c.segment_frames = 40;
  c.workers = 2;
  c.on_notice = [](const std::string&) {};
  data::loader l(ds.split(ds.description().splits[0].name), c);
  for (std::uint64_t b = 0; b < l.batches_per_epoch(); ++b) {
    auto batch = l.next().value();
    for (index_t r = 0; r < batch.batch; ++r) {
      const std::string& id = batch.ids[static_cast<std::size_t>(r)];
      const int e = std::stoi(id.substr(5, id.find('-') - 5)) * 2 + (id.back() - '0');
      const index_t frames = 30 + 3 * e, off = batch.offsets[static_cast<std::size_t>(r)];
      const auto want = codes_of(e);
      bool same = true;
      for (int k = 0; k < 4; ++k)
        for (index_t t = 0; t < batch.lengths[static_cast<std::size_t>(r)]; ++t)
          same = same && batch.at(r, k, t) == want[static_cast<std::size_t>(k * frames + off + t)];
      CHECK(same);
      CHECK(*batch.conditions[static_cast<std::size_t>(r)].caption == "clip number " + std::to_string(e));
    }
  }
}

TEST_CASE("splits follow group and seed, deterministically", "[pack]") {
  scratch_dir dir;
  std::filesystem::create_directories(dir / "in");
  for (int e = 0; e < 30; ++e) write_input(dir / "in", e);
  auto o = options(dir);
  o.split_ratios = {0.5, 0.5};
  const auto a = data::pack_directory(o);
  o.output = dir / "again";
  const auto b = data::pack_directory(o);
  CHECK(a.result.fingerprint("train") == b.result.fingerprint("train"));
  CHECK(a.result.to_json()["splits"] == b.result.to_json()["splits"]);
  o.output = dir / "reseeded";
  o.seed = 4;
  const auto c = data::pack_directory(o);
  CHECK(c.result.fingerprint("train") != a.result.fingerprint("train"));
  // the rule itself: XXH64(group, seed) → u in [0, 1) → first cumulative ratio above u
  for (int e = 0; e < 30; ++e) {
    const std::string file = "clip" + std::to_string(100 + e) + ".npy";
    CHECK(etude::data::detail::split_of(file, 3, {0.5, 1.0}) ==
          ((etude::detail::xxhash64::of(file.data(), file.size(), 3) >> 11) * 0x1.0p-53 < 0.5 ? 0u : 1u));
  }
  // a ratio of 1 puts everything in one split; empty splits are left out and noted
  o.output = dir / "one";
  o.split_ratios = {1.0, 0.0};
  const auto one = data::pack_directory(o);
  CHECK(one.result.splits.size() == 1);
  CHECK(one.result.split("train").examples() == 30);
  REQUIRE(one.notes.size() == 1);
  CHECK_THAT(one.notes[0], Catch::Contains("\"valid\" received no examples"));
}

TEST_CASE("bad inputs are rejected with their reason and counted", "[pack][bad_input]") {
  scratch_dir dir;
  const auto in = dir / "in";
  std::filesystem::create_directories(in);
  for (int e = 0; e < 4; ++e) write_input(in, e);  // clip100 .. clip103 are good
  auto good = codes_of(0);
  write_npy(in / "a_out_of_range.npy", "<i4", {4, 30}, [&] {
    std::vector<std::int32_t> v(good.begin(), good.end());
    v[2 * 30 + 7] = 2048;
    return v;
  }());
  write_npy(in / "b_negative.npy", "<i8", {4, 30}, [&] {
    auto v = good;
    v[5] = -1;
    return v;
  }());
  write_npy(in / "c_three_codebooks.npy", "<i2", {3, 10}, std::vector<std::int16_t>(30, 1));
  write_npy(in / "d_empty.npy", "<i2", {4, 0}, std::vector<std::int16_t>{});
  write_npy(in / "e_float.npy", "<f4", {4, 2}, std::vector<float>(8, 1.0f));
  write_npy(in / "f_fortran.npy", "<i2", {4, 2}, std::vector<std::int16_t>(8, 1), 1, true);
  etude::test::write_bytes(in / "g_garbage.npy", {1, 2, 3});
  write_npy(in / "h_dup.npy", "<i2", {4, 2}, std::vector<std::int16_t>(8, 1));
  write_npy(in / "i_badmeta.npy", "<i2", {4, 2}, std::vector<std::int16_t>(8, 1));
  write_lines(dir / "meta.jsonl", {
                                      R"({"file": "h_dup.npy", "id": "clip100"})",            // id clash with clip100
                                      R"({"file": "i_badmeta.npy", "attributes": {"k": [1]}})",  // bad attribute
                                      R"({"file": "missing.npy"})",
                                      R"(not json)",
                                      R"({"id": "no file"})",
                                      "",
                                  });
  auto o = options(dir);
  o.metadata = dir / "meta.jsonl";
  const auto r = data::pack_directory(o);
  CHECK(r.inputs == 13);
  std::map<std::string, std::string> why;
  for (const auto& x : r.rejected) why[x.input] = x.reason;
  CHECK(r.rejected.size() == 13);  // 9 files + 4 metadata lines
  CHECK(r.packed == 4);
  CHECK_THAT(why["a_out_of_range.npy"], Catch::Contains("token 2048 at codebook 2, frame 7") && Catch::Contains("[0, 2048)"));
  CHECK_THAT(why["b_negative.npy"], Catch::Contains("token -1 at codebook 0, frame 5"));
  CHECK_THAT(why["c_three_codebooks.npy"], Catch::Contains("3 codebooks but the dataset has K = 4"));
  CHECK_THAT(why["d_empty.npy"], Catch::Contains("empty"));
  CHECK_THAT(why["e_float.npy"], Catch::Contains("dtype '<f4'"));
  CHECK_THAT(why["f_fortran.npy"], Catch::Contains("Fortran"));
  CHECK_THAT(why["g_garbage.npy"], Catch::Contains("not a .npy file"));
  CHECK_THAT(why["h_dup.npy"], Catch::Contains("id \"clip100\" is already used"));
  CHECK_THAT(why["i_badmeta.npy"], Catch::Contains("metadata line is malformed"));
  CHECK_THAT(why["metadata line 2"], Catch::Contains("attribute \"k\""));
  CHECK_THAT(why["metadata line 3"], Catch::Contains("missing.npy, which is not"));
  CHECK_THAT(why["metadata line 4"], Catch::Contains("not valid JSON"));
  CHECK_THAT(why["metadata line 5"], Catch::Contains("\"file\""));
  // the record on disk
  const auto m = data::manifest::load(dir / "out" / "manifest.json");
  CHECK(m.provenance["rejected"] == 13);
  std::ifstream rej(dir / "out" / "rejected.jsonl");
  int lines = 0;
  for (std::string l; std::getline(rej, l);) ++lines;
  CHECK(lines == 13);

  SECTION("--codebooks decides K up front") {
    o.codec.codebooks = 3;
    o.output = dir / "k3";
    o.metadata.reset();
    const auto k3 = data::pack_directory(o);
    CHECK(k3.packed == 1);  // only the three-codebook file
  }
}

TEST_CASE("fatal packing errors throw", "[pack][bad_input]") {
  scratch_dir dir;
  std::filesystem::create_directories(dir / "in");
  auto o = options(dir);
  CHECK_THROWS_WITH(data::pack_directory(o), Catch::Contains("no .npy files"));
  etude::test::write_bytes(dir / "in" / "x.npy", {0});
  CHECK_THROWS_WITH(data::pack_directory(o), Catch::Contains("all 1 inputs were rejected"));
  o.split_ratios = {0.5, 0.2};
  CHECK_THROWS_WITH(data::pack_directory(o), Catch::Contains("sum to 1"));
  o = options(dir);
  o.input = dir / "absent";
  CHECK_THROWS_AS(data::pack_directory(o), etude::data_error);
  o = options(dir);
  o.metadata = dir / "absent.jsonl";
  CHECK_THROWS_WITH(data::pack_directory(o), Catch::Contains("absent.jsonl"));
}

TEST_CASE("split names cannot leave the output directory", "[pack][bad_input]") {
  scratch_dir dir;
  std::filesystem::create_directories(dir / "in");
  for (int e = 0; e < 4; ++e) write_input(dir / "in", e);
  const std::vector<std::string> bad_names{"../x", "a/b", "..", ".", "", "/abs", std::string("x\0y", 3)};
  for (const std::string& bad : bad_names) {
    INFO("split name " << etude::detail::quoted_name(bad));
    auto o = options(dir);
    o.split_ratios = {0.5, 0.5};
    o.split_names = {"train", bad};
    CHECK_THROWS_AS(data::pack_directory(o), etude::invalid_argument);
    CHECK_THROWS_WITH(data::pack_directory(o), Catch::Contains("split name " + etude::detail::quoted_name(bad)) &&
                                                   Catch::Contains("plain file name"));
    // refused before anything is written, inside or outside the output directory
    CHECK_FALSE(std::filesystem::exists(dir / "out"));
    CHECK_FALSE(std::filesystem::exists(dir / "x-00000.etok"));
  }
}

#ifdef ETUDE_PACK_TOKENS
TEST_CASE("the pack_tokens tool packs, reports and exits by the rules", "[pack][tool]") {
  scratch_dir dir;
  std::filesystem::create_directories(dir / "in");
  for (int e = 0; e < 6; ++e) write_input(dir / "in", e);
  const std::string base = std::string(ETUDE_PACK_TOKENS) + " --input " + (dir / "in").string() + " --output " +
                           (dir / "out").string() +
                           " --name clips --version 1 --card 2048 --frame-rate 50 --codec-name encodec_32khz"
                           " --codec-version 1 --split-ratios 0.5,0.5 --seed 2 --shard-examples 2";
  auto run = [](const std::string& cmd) {
    const int status = std::system((cmd + " > /dev/null 2>&1").c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  CHECK(run(base) == 0);
  const auto m = data::manifest::load(dir / "out" / "manifest.json");
  CHECK(m.split("train").examples() + m.split("valid").examples() == 6);
  CHECK(m.provenance["seed"] == 2);
  write_npy(dir / "in" / "z.npy", "<i2", {4, 3}, std::vector<std::int16_t>(12, 4096));
  CHECK(run(base) == 0);                // packed, z.npy rejected and reported
  CHECK(run(base + " --strict") == 2);  // ... which --strict makes an error
  CHECK(run(base + " --card") == 1);
  CHECK(run(base + " --split-ratios 0.5,x") == 1);
  CHECK(run(std::string(ETUDE_PACK_TOKENS) + " --input " + (dir / "in").string()) == 1);
  CHECK(run(std::string(ETUDE_PACK_TOKENS) + " --help") == 0);
  // Usage errors name the option and what is wrong: no truncation, no silent saturation.
  auto error_of = [&](const std::string& args) {
    const auto err = dir / "stderr.txt";
    const int status = std::system((base + " " + args + " > /dev/null 2> " + err.string()).c_str());
    const auto bytes = etude::test::read_bytes(err);
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string(bytes.begin(), bytes.end()));
  };
  const auto card = error_of("--card 99999999999");
  CHECK(card.first == 1);
  CHECK_THAT(card.second, Catch::StartsWith("pack_tokens: --card: 99999999999 is out of range") &&
                              Catch::Contains("2147483647"));
  CHECK_THAT(error_of("--card 0").second, Catch::Contains("--card: 0 is out of range: the least allowed is 1"));
  CHECK_THAT(error_of("--card 12x").second, Catch::Contains("--card: '12x' is not an integer"));
  CHECK_THAT(error_of("--seed -1").second, Catch::Contains("--seed: -1 is out of range"));
  CHECK_THAT(error_of("--shard-examples 0").second, Catch::Contains("--shard-examples: 0 is out of range"));
  CHECK_THAT(error_of("--frame-rate 0").second, Catch::Contains("--frame-rate: 0 is out of range"));
  CHECK_THAT(error_of("--frame-rate nan").second, Catch::Contains("--frame-rate: nan is not a finite number"));
  CHECK_THAT(error_of("--split-ratios 0.5,x").second, Catch::Contains("--split-ratios: item 2 of '0.5,x'"));
  // a split name that would write outside --output is refused, and nothing is written there
  const auto escape = error_of("--output " + (dir / "out2").string() + " --split-names ../x,valid");
  CHECK(escape.first == 1);
  CHECK_THAT(escape.second, Catch::Contains("split name \"../x\""));
  CHECK_FALSE(std::filesystem::exists(dir / "x-00000.etok"));
  CHECK_FALSE(std::filesystem::exists(dir / "out2"));
}
#endif
