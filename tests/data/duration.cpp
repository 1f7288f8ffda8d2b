// Seconds → frames → steps → tokens per batch, checked at compile time, and the table of
// docs/sequence-length.md checked against the calculator so the document cannot drift.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <sstream>

#include <etude/config/pattern.hpp>
#include <etude/data/duration.hpp>

namespace pat = etude::pattern;
namespace data = etude::data;
using etude::index_t;

// MusicGen: 30 s of 32 kHz audio, EnCodec hop 640 (50 Hz), K = 4.
constexpr auto musicgen_delay = data::budget_for_audio<pat::delay<0, 1, 2, 3>>(30.0, 32000, 640, 4);
static_assert(musicgen_delay.frames == 1500);
static_assert(musicgen_delay.steps == 1501);
static_assert(musicgen_delay.codec_tokens == 6000);
static_assert(musicgen_delay.positions == 1501);
static_assert(musicgen_delay.slots == 6004);
static_assert(data::budget_for<pat::delay<0, 1, 2, 3>>(30.0, 50.0, 4) == musicgen_delay);
static_assert(data::budget_for<pat::parallel>(30.0, 50.0, 4).steps == 1501);
static_assert(data::budget_for<pat::flatten>(30.0, 50.0, 4).steps == 6001);
static_assert(data::budget_for<pat::coarse_first<>>(30.0, 50.0, 4).steps == 3001);
static_assert(data::budget_for<pat::musiclm<2>>(30.0, 50.0, 4).steps == 6001);
static_assert(data::budget_for<pat::grouped<0, 1, 1, 1>>(30.0, 50.0, 4).steps == 3001);
// AudioCraft's valid steps keep the smallest delay's all-special steps
static_assert(data::budget_for<pat::delay<1, 2, 3, 4>>(30.0, 50.0, 4).steps == 1502);
static_assert(data::budget_for<pat::coarse_first<1, 1, 1>>(30.0, 50.0, 4).steps == 3002);
// per batch
static_assert(data::budget_for<pat::delay<0, 1, 2, 3>>(30.0, 50.0, 4, 16).codec_tokens == 16 * 6000);
static_assert(data::budget_for<pat::delay<0, 1, 2, 3>>(30.0, 50.0, 4, 16).positions == 16 * 1501);
static_assert(data::budget_for_frames<pat::delay<0, 1, 2, 3>>(256, 4, 8).codec_tokens == 8192);
static_assert(data::budget_for_frames<pat::delay<0, 1, 2, 3>>(256, 4, 8).positions == 2056);
// rounding: partial frames round up, binary64 noise does not add a frame
static_assert(data::frames_for(0.1, 30.0) == 3);
static_assert(data::frames_for(10.0, 75.0) == 750);
static_assert(data::frames_for(1.01, 50.0) == 51);
static_assert(data::frames_for_audio(1.0, 24000, 320) == 75);
static_assert(data::frames_for_audio(1.001, 32000, 640) == 51);  // 32032 samples: a partial last frame

TEST_CASE("the calculator refuses what it cannot size", "[duration]") {
  CHECK_THROWS_AS(data::frames_for(0.0, 50.0), etude::invalid_argument);
  CHECK_THROWS_AS(data::frames_for_audio(1.0, 32000, 0), etude::invalid_argument);
  using delay4 = pat::delay<0, 1, 2, 3>;
  CHECK_THROWS_AS(data::budget_for<delay4>(30.0, 50.0, 8), etude::invalid_argument);
  CHECK_THROWS_AS(data::budget_for<pat::musiclm<2>>(30.0, 50.0, 3), etude::invalid_argument);
}

TEST_CASE("docs/sequence-length.md agrees with the calculator", "[duration][docs]") {
  const std::map<std::string, data::sequence_budget> expected = {
      {"`delay<0, 1, 2, 3>`", data::budget_for<pat::delay<0, 1, 2, 3>>(30.0, 50.0, 4)},
      {"`parallel`", data::budget_for<pat::parallel>(30.0, 50.0, 4)},
      {"`flatten`", data::budget_for<pat::flatten>(30.0, 50.0, 4)},
      {"`coarse_first<>`", data::budget_for<pat::coarse_first<>>(30.0, 50.0, 4)},
      {"`musiclm<2>`", data::budget_for<pat::musiclm<2>>(30.0, 50.0, 4)},
      {"`grouped<0, 1, 1, 1>`", data::budget_for<pat::grouped<0, 1, 1, 1>>(30.0, 50.0, 4)},
      {"`delay<1, 2, 3, 4>`", data::budget_for<pat::delay<1, 2, 3, 4>>(30.0, 50.0, 4)},
      {"`coarse_first<1, 1, 1>`", data::budget_for<pat::coarse_first<1, 1, 1>>(30.0, 50.0, 4)},
  };
  std::ifstream doc(std::string(ETUDE_SOURCE_DIR) + "/docs/sequence-length.md");
  REQUIRE(doc);
  std::map<std::string, int> rows;
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream ss(line.substr(1));
    for (std::string cell; std::getline(ss, cell, '|');) {
      const auto a = cell.find_first_not_of(' '), b = cell.find_last_not_of(' ');
      cells.push_back(a == std::string::npos ? "" : cell.substr(a, b - a + 1));
    }
    REQUIRE(cells.size() >= 6);
    INFO(line);
    const auto it = expected.find(cells[0]);
    REQUIRE(it != expected.end());
    const auto& b = it->second;
    CHECK(std::stoll(cells[1]) == b.frames);
    CHECK(std::stoll(cells[2]) == b.steps);
    CHECK(std::stoll(cells[3]) == b.codec_tokens);
    CHECK(std::stoll(cells[4]) == b.positions);
    CHECK(std::stoll(cells[5]) == b.slots);
    ++rows[cells[0]];
  }
  CHECK(rows.size() == expected.size());
}
