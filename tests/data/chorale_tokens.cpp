// The chorale token format read back: notes from onsets and holds, lenient decoding of defects,
// and the per-sample checks a generation run records (data/chorale_tokens.hpp).
#include <catch2/catch.hpp>

#include <vector>

#include <etude/data/chorale_tokens.hpp>

using namespace etude::data;
using etude::token_t;

namespace {
constexpr token_t R = chorale_vocab::rest;
constexpr token_t H = chorale_vocab::hold;
token_t on(int midi) { return chorale_onset(midi); }

std::vector<token_t> rows(const std::vector<std::vector<token_t>>& r) {
  std::vector<token_t> out;
  for (const auto& row : r) out.insert(out.end(), row.begin(), row.end());
  return out;
}
}  // namespace

TEST_CASE("chorale vocabulary: ids and pitches", "[data][chorale]") {
  CHECK(chorale_onset(36) == 2);
  CHECK(chorale_onset(60) == 26);
  CHECK(chorale_onset(84) == 50);
  CHECK(chorale_pitch(2) == 36);
  CHECK(chorale_pitch(50) == 84);
  CHECK(chorale_pitch(0) == -1);
  CHECK(chorale_pitch(1) == -1);
  CHECK(chorale_pitch(51) == -1);
  CHECK(chorale_pitch(-3) == -1);
  CHECK(chorale_voice_name(0) == "Soprano");
  CHECK(chorale_voice_name(3) == "Bass");
  CHECK(chorale_voice_name(5) == "Voice 5");
}

TEST_CASE("decode_chorale: onsets and holds become notes per voice", "[data][chorale]") {
  // soprano: C5 for a quarter, D5 repeated twice as eighths, rest; bass: G2 whole bar with a rest first
  const auto tokens = rows({{on(72), H, H, H, on(74), H, on(74), H, R, R},
                            {R, on(43), H, H, H, H, H, H, H, H}});
  const chorale c = decode_chorale(tokens, 2, 10);
  CHECK(c.voices == 2);
  CHECK(c.frames == 10);
  REQUIRE(c.notes.size() == 4);
  CHECK(c.notes[0] == chorale_note{0, 0, 4, 72});
  CHECK(c.notes[1] == chorale_note{0, 4, 2, 74});
  CHECK(c.notes[2] == chorale_note{0, 6, 2, 74});  // a repeated note is a new onset
  CHECK(c.notes[3] == chorale_note{1, 1, 9, 43});
  CHECK(c.notes[3].end() == 10);
}

TEST_CASE("decode_chorale: defects are silent and never extend a note", "[data][chorale]") {
  // hold at the start, hold after a rest, an unused id between a note and a hold, ids outside the card
  const auto tokens = rows({{H, H, on(60), H, 55, H, R, H, on(62), -1, H, 64, on(64), H}});
  const chorale c = decode_chorale(tokens, 1, 14);
  REQUIRE(c.notes.size() == 3);
  CHECK(c.notes[0] == chorale_note{0, 2, 2, 60});
  CHECK(c.notes[1] == chorale_note{0, 8, 1, 62});
  CHECK(c.notes[2] == chorale_note{0, 12, 2, 64});
}

TEST_CASE("decode_chorale: refuses an array of the wrong size", "[data][chorale]") {
  const std::vector<token_t> tokens(7, R);
  CHECK_THROWS_AS(decode_chorale(tokens, 2, 4), etude::invalid_input);
  CHECK_THROWS_WITH(decode_chorale(tokens, 2, 4), Catch::Contains("7 tokens") && Catch::Contains("2 streams of 4"));
  CHECK_THROWS_AS(decode_chorale(tokens, 0, 0), etude::invalid_input);
}

TEST_CASE("check_chorale: a corpus-like sample has no findings", "[data][chorale]") {
  const auto tokens = rows({{on(72), H, H, H}, {on(67), H, on(65), H}, {on(60), H, H, H}, {on(48), H, H, R}});
  const auto report = check_chorale(tokens, 4, 4, chorale_corpus_ranges());
  CHECK(report.ok());
  CHECK(report.notes == 5);
  CHECK(report.findings.empty());
}

TEST_CASE("check_chorale: every kind of defect, with voice and frame", "[data][chorale]") {
  const auto tokens = rows({
      {on(72), H, 51, H},            // soprano: unused id at 2, then a hold after the bad id at 3
      {R, H, H, on(80)},             // alto: a run of two holds after a rest (one finding), 80 above 74
      {64, -2, on(60), H},           // tenor: ids outside [0, 64) at 0 and 1
      {H, on(36), H, on(35 + 1)},    // bass: hold at the start
  });
  const auto report = check_chorale(tokens, 4, 4, chorale_corpus_ranges());
  CHECK_FALSE(report.ok());
  REQUIRE(report.findings.size() == 7);
  const auto& f = report.findings;
  CHECK((f[0].defect == chorale_defect::unused_id && f[0].voice == 0 && f[0].frame == 2));
  CHECK((f[1].defect == chorale_defect::hold_without_note && f[1].voice == 0 && f[1].frame == 3));
  CHECK_THAT(f[1].what, Catch::Contains("Soprano, frame 3") && Catch::Contains("bad id 51"));
  CHECK((f[2].defect == chorale_defect::hold_without_note && f[2].voice == 1 && f[2].frame == 1));
  CHECK_THAT(f[2].what, Catch::Contains("after a rest") && Catch::Contains("2 frames"));
  CHECK((f[3].defect == chorale_defect::pitch_out_of_range && f[3].voice == 1 && f[3].frame == 3));
  CHECK_THAT(f[3].what, Catch::Contains("pitch 80") && Catch::Contains("53..74"));
  CHECK((f[4].defect == chorale_defect::id_out_of_range && f[4].voice == 2 && f[4].frame == 0));
  CHECK((f[5].defect == chorale_defect::id_out_of_range && f[5].voice == 2 && f[5].frame == 1));
  CHECK((f[6].defect == chorale_defect::hold_without_note && f[6].voice == 3 && f[6].frame == 0));
  CHECK_THAT(f[6].what, Catch::Contains("start of the stream"));
  CHECK(report.count(chorale_defect::hold_without_note) == 3);
  CHECK(report.count(chorale_defect::silent) == 0);
}

TEST_CASE("check_chorale: ranges are a parameter", "[data][chorale]") {
  const auto tokens = rows({{on(84), H}});
  CHECK(check_chorale(tokens, 1, 2, {{36, 84}}).ok());
  const auto narrow = check_chorale(tokens, 1, 2, {{60, 72}});
  REQUIRE(narrow.findings.size() == 1);
  CHECK(narrow.findings[0].defect == chorale_defect::pitch_out_of_range);
  CHECK_THROWS_AS(check_chorale(tokens, 1, 2, chorale_corpus_ranges()), etude::invalid_argument);
}

TEST_CASE("check_chorale: a silent sample is one finding, and noise can be capped", "[data][chorale]") {
  const std::vector<token_t> rests(4 * 8, R);
  const auto silent = check_chorale(rests, 4, 8, chorale_corpus_ranges());
  REQUIRE(silent.findings.size() == 1);
  CHECK(silent.findings[0].defect == chorale_defect::silent);
  CHECK(silent.findings[0].voice == -1);
  CHECK(silent.notes == 0);

  std::vector<token_t> noise(4 * 8, 60);  // unused everywhere: 32 findings, and silent
  const auto all = check_chorale(noise, 4, 8, chorale_corpus_ranges());
  CHECK(all.count(chorale_defect::unused_id) == 32);
  CHECK(all.count(chorale_defect::silent) == 1);
  const auto capped = check_chorale(noise, 4, 8, chorale_corpus_ranges(), 5);
  CHECK(capped.findings.size() == 6);
  CHECK(capped.findings.back().defect == chorale_defect::silent);
}
