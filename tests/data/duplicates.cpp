// Exact duplicates by token content (data/duplicates.hpp): the packer reports an example whose
// tokens are in two splits as a leak and two in one split as a duplicate, names both, lists them
// in the manifest's provenance, and a dataset packed before finds the same pairs; a pack without
// copies reports nothing. The pack_tokens tool warns and, with --strict, exits 2 on a leak.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <set>

#include <etude/data/dataset.hpp>
#include <etude/data/duplicates.hpp>
#include <etude/data/pack.hpp>

#include "support.hpp"

using etude::index_t;
namespace data = etude::data;
using etude::test::scratch_dir;
using etude::test::write_npy;

namespace {

constexpr std::uint64_t seed = 3;

// (4, 20) codes, different for each `which`
std::vector<std::int32_t> codes(std::uint64_t which) {
  const auto t = etude::test::example_tokens(4, 20, 2048, 500 + which);
  return {t.begin(), t.end()};
}
void write_codes(const std::filesystem::path& dir, const std::string& stem, std::uint64_t which) {
  write_npy(dir / (stem + ".npy"), "<i4", {4, 20}, codes(which));
}

// The next stem "clip<i>" (i from `next` on) that splits 0.5/0.5 with the seed put in split s.
std::string stem_in(std::size_t s, int& next) {
  for (;;) {
    const std::string stem = "clip" + std::to_string(next++);
    if (data::detail::split_of(stem + ".npy", seed, {0.5, 1.0}) == s) return stem;
  }
}

data::pack_options options(const scratch_dir& dir, const std::string& in) {
  data::pack_options o;
  o.input = dir / in;
  o.output = dir / (in + "-out");
  o.name = "clips";
  o.version = "1";
  o.codec = {.name = "encodec_32khz", .version = "1", .codebooks = 0, .card = 2048, .frame_rate = 50, .sample_rate = 32000};
  o.split_ratios = {0.5, 0.5};
  o.seed = seed;
  o.shard_examples = 3;
  return o;
}

struct planted {
  std::string leak_train, leak_valid, dup_a, dup_b;
};

// Eight distinct examples over both splits, plus one content in train and valid (a leak) and one
// content twice in train (a duplicate). Without `copies`, only the distinct ones.
planted write_inputs(const std::filesystem::path& dir, bool copies) {
  std::filesystem::create_directories(dir);
  int at = 0;
  for (std::uint64_t e = 0; e < 8; ++e) write_codes(dir, stem_in(e % 2, at), e);
  planted p;
  if (!copies) return p;
  p.leak_train = stem_in(0, at);
  p.leak_valid = stem_in(1, at);
  p.dup_a = stem_in(0, at);
  p.dup_b = stem_in(0, at);
  write_codes(dir, p.leak_train, 100);
  write_codes(dir, p.leak_valid, 100);
  write_codes(dir, p.dup_a, 101);
  write_codes(dir, p.dup_b, 101);
  return p;
}

std::set<std::string> ids_of(const data::duplicate& d) { return {d.first.id, d.second.id}; }

}  // namespace

TEST_CASE("the packer reports the same tokens in two splits as a leak, twice in one as a duplicate",
          "[duplicates][pack]") {
  scratch_dir dir;
  const planted p = write_inputs(dir / "in", true);
  const auto report = data::pack_directory(options(dir, "in"));
  CHECK(report.packed == 12);
  CHECK(report.rejected.empty());

  REQUIRE(report.leaks.size() == 1);
  const auto& leak = report.leaks[0];
  CHECK(leak.across_splits());
  CHECK(ids_of(leak) == std::set<std::string>{p.leak_train, p.leak_valid});
  CHECK(std::set<std::string>{leak.first.split, leak.second.split} == std::set<std::string>{"train", "valid"});
  CHECK((leak.first.id == p.leak_train ? leak.first.input : leak.second.input) == p.leak_train + ".npy");
  CHECK_THAT(data::describe(leak), Catch::StartsWith("leak across splits: ") && Catch::Contains(p.leak_train) &&
                                       Catch::Contains(p.leak_valid) && Catch::Contains("(valid, "));

  REQUIRE(report.duplicates.size() == 1);
  CHECK_FALSE(report.duplicates[0].across_splits());
  CHECK(ids_of(report.duplicates[0]) == std::set<std::string>{p.dup_a, p.dup_b});
  CHECK(report.duplicates[0].first.split == "train");
  CHECK_THAT(data::describe(report.duplicates[0]), Catch::StartsWith("duplicate within split \"train\""));

  // the manifest lists both in its provenance, and still loads
  const auto m = data::manifest::load(dir / "in-out" / "manifest.json");
  REQUIRE(m.provenance.contains("leaks"));
  REQUIRE(m.provenance["leaks"].size() == 1);
  const auto& l = m.provenance["leaks"][0];
  CHECK(std::set<std::string>{l["first"]["id"], l["second"]["id"]} ==
        std::set<std::string>{p.leak_train, p.leak_valid});
  CHECK(m.provenance["duplicates"].size() == 1);

  // the packed dataset, checked afterwards, gives the same pairs with the same hashes
  const data::dataset packed(dir / "in-out" / "manifest.json");
  const auto found = data::find_duplicates(packed);
  REQUIRE(found.leaks.size() == 1);
  CHECK(ids_of(found.leaks[0]) == ids_of(leak));
  CHECK(found.leaks[0].hash == leak.hash);
  CHECK_THAT(found.leaks[0].second.input, Catch::StartsWith("shard "));
  REQUIRE(found.within_split.size() == 1);
  CHECK(ids_of(found.within_split[0]) == ids_of(report.duplicates[0]));
}

TEST_CASE("without copies nothing is reported and the manifest has no leak list", "[duplicates][pack]") {
  scratch_dir dir;
  write_inputs(dir / "in", false);
  const auto report = data::pack_directory(options(dir, "in"));
  CHECK(report.packed == 8);
  CHECK(report.leaks.empty());
  CHECK(report.duplicates.empty());
  const auto m = data::manifest::load(dir / "in-out" / "manifest.json");
  CHECK_FALSE(m.provenance.contains("leaks"));
  CHECK_FALSE(m.provenance.contains("duplicates"));
  const auto found = data::find_duplicates(data::dataset(dir / "in-out" / "manifest.json"));
  CHECK(found.leaks.empty());
  CHECK(found.within_split.empty());
}

TEST_CASE("content hashes and the finder's rules", "[duplicates]") {
  const std::vector<std::int64_t> a = {1, 2, 3, 4, 5, 6};
  auto b = a;
  CHECK(data::token_content_hash(a, 2, 3) == data::token_content_hash(b, 2, 3));
  CHECK(data::token_content_hash(a, 2, 3) != data::token_content_hash(a, 3, 2));  // the shape takes part
  b[5] = 7;
  CHECK(data::token_content_hash(a, 2, 3) != data::token_content_hash(b, 2, 3));

  // three copies in train and one in valid: two duplicates against the first in train, one leak
  data::duplicate_finder f;
  CHECK(f.add({"x0", "train", "x0.npy"}, 42).empty());
  CHECK(f.add({"x1", "train", "x1.npy"}, 42).size() == 1);
  CHECK(f.add({"x2", "train", "x2.npy"}, 42).size() == 1);
  CHECK(f.add({"y", "valid", "y.npy"}, 42).size() == 1);
  CHECK(f.add({"z", "valid", "z.npy"}, 43).empty());
  REQUIRE(f.within_split().size() == 2);
  CHECK(f.within_split()[1].first.id == "x0");
  CHECK(f.within_split()[1].second.id == "x2");
  REQUIRE(f.leaks().size() == 1);
  CHECK(f.leaks()[0].first.id == "x0");
  CHECK(f.leaks()[0].second.id == "y");
}

#ifdef ETUDE_PACK_TOKENS
TEST_CASE("pack_tokens warns about a leak naming both examples, and --strict fails on it", "[duplicates][tool]") {
  scratch_dir dir;
  const planted p = write_inputs(dir / "leaky", true);
  write_inputs(dir / "clean", false);
  auto run = [&](const std::string& in, const std::string& extra) {
    const auto err = dir / "stderr.txt";
    const std::string cmd = std::string(ETUDE_PACK_TOKENS) + " --input " + (dir / in).string() + " --output " +
                            (dir / (in + "-out")).string() +
                            " --name clips --version 1 --card 2048 --frame-rate 50 --codec-name encodec_32khz"
                            " --codec-version 1 --split-ratios 0.5,0.5 --seed 3 " + extra + " > /dev/null 2> " +
                            err.string();
    const int status = std::system(cmd.c_str());
    const auto bytes = etude::test::read_bytes(err);
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string(bytes.begin(), bytes.end()));
  };
  const auto leaky = run("leaky", "");
  CHECK(leaky.first == 0);
  CHECK_THAT(leaky.second, Catch::Contains("warning: leak across splits: ") && Catch::Contains(p.leak_train) &&
                               Catch::Contains(p.leak_valid) &&
                               Catch::Contains("warning: duplicate within split \"train\"") &&
                               Catch::Contains("warning: 1 leak across splits"));
  CHECK(run("leaky", "--strict").first == 2);
  const auto clean = run("clean", "--strict");
  CHECK(clean.first == 0);
  CHECK(clean.second.find("warning") == std::string::npos);
}
#endif
