// Standard MIDI Files written by etude (track/midi.hpp), read back by an independent reader:
// PyPI's mido (tests/track/read_midi.py) must see the format, the division, one named track per
// voice on its own channel and program, the tempo and every note at its tick and second. Reports
// itself skipped (exit 77, tests/skip.hpp), saying why, when python3 or mido is missing (`python3 -m pip install mido`).
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <etude/data/chorale_tokens.hpp>
#include <etude/track/midi.hpp>

#include "../skip.hpp"
#include "support.hpp"

using namespace etude::track;
using etude::data::chorale;
using etude::data::chorale_note;
using etude::test::read_bytes;
using etude::test::scratch_dir;
namespace fs = std::filesystem;

namespace {

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string text_of(const fs::path& p) {
  const auto b = read_bytes(p);
  return {b.begin(), b.end()};
}

// Runs read_midi.py on `file`; false (after a WARN) when the reader is not there.
bool read_with_mido(const fs::path& file, const scratch_dir& dir, nlohmann::json& out) {
  const std::string python = ETUDE_PY3;
  if (python.empty()) {
    ETUDE_TEST_SKIP("no python3 was found when configuring; install python3 and `python3 -m pip install mido`");
    return false;
  }
  const fs::path json = dir / "midi.json", err = dir / "midi.err";
  const std::string cmd = quoted(python) + " " + quoted(ETUDE_READ_MIDI_PY) + " " + quoted(file.string()) + " > " +
                          quoted(json.string()) + " 2> " + quoted(err.string());
  const int status = std::system(cmd.c_str());
  REQUIRE(status != -1);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) {
    ETUDE_TEST_SKIP(text_of(err) << "(python: " << python << ")");
    return false;
  }
  INFO("read_midi.py stderr: " << text_of(err));
  REQUIRE(WEXITSTATUS(status) == 0);
  out = nlohmann::json::parse(text_of(json));
  return true;
}

// Four voices over 20 frames: held notes, a repeated pitch (released and struck at one tick),
// rests and a trailing rest in every voice.
chorale sample() {
  const std::vector<std::vector<etude::token_t>> rows = {
      {28, 1, 1, 1, 30, 1, 30, 1, 32, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0},  // soprano: D4.. (62, 64, 64, 66)
      {23, 1, 1, 1, 25, 1, 1, 1, 0, 0, 28, 1, 1, 1, 1, 1, 1, 0, 0, 0},  // alto: 57, 59, 62
      {16, 1, 16, 1, 16, 1, 16, 1, 21, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0},  // tenor: 50 x4, 55
      {0, 0, 0, 0, 9, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 0},     // bass: 43, 36
  };
  std::vector<etude::token_t> tokens;
  for (const auto& r : rows) tokens.insert(tokens.end(), r.begin(), r.end());
  return etude::data::decode_chorale(tokens, 4, 20);
}

}  // namespace

TEST_CASE("midi: mido reads etude's file: tracks, channels, programs, tempo, notes", "[track][midi]") {
  scratch_dir dir;
  const chorale c = sample();
  REQUIRE(c.notes.size() == 14);
  midi_options o;
  o.title = "test chorale";
  const fs::path file = dir / "sample.mid";
  write_midi(file, c, o);
  CHECK(fs::exists(file));

  nlohmann::json j;
  if (!read_with_mido(file, dir, j)) return;
  CHECK(j.at("type") == 1);
  CHECK(j.at("ticks_per_beat") == 480);
  const auto& tracks = j.at("tracks");
  REQUIRE(tracks.size() == 5);
  const auto& meta = tracks[0];
  CHECK(meta.at("name") == "test chorale");
  CHECK(meta.at("tempos") == nlohmann::json::parse("[[0, 500000]]"));  // 120 bpm
  CHECK(meta.at("time_signatures") == nlohmann::json::parse("[[0, 4, 4]]"));
  CHECK(meta.at("notes").empty());
  const std::vector<std::string> names{"Soprano", "Alto", "Tenor", "Bass"};
  for (int k = 0; k < 4; ++k) {
    INFO("voice " << k);
    const auto& t = tracks[static_cast<std::size_t>(k + 1)];
    CHECK(t.at("name") == names[static_cast<std::size_t>(k)]);
    CHECK(t.at("programs") == nlohmann::json::array({nlohmann::json::array({0, k, gm_program::church_organ})}));
    CHECK(t.at("end_tick") == 20 * 120);  // the whole sample, trailing rests included
    std::vector<chorale_note> expect;
    for (const auto& n : c.notes)
      if (n.voice == k) expect.push_back(n);
    const auto& notes = t.at("notes");
    REQUIRE(notes.size() == expect.size());
    for (std::size_t i = 0; i < expect.size(); ++i) {
      INFO("note " << i);
      CHECK(notes[i] == nlohmann::json::array({k, expect[i].pitch, 80, expect[i].onset * 120, expect[i].end() * 120}));
    }
  }
  // in seconds, as a player hears it: 8 frames per second
  CHECK(j.at("length_s").get<double>() == Approx(20.0 / 8.0));
  const auto& played = j.at("played");
  REQUIRE(played.size() == c.notes.size());
  std::size_t matched = 0;
  for (const auto& n : c.notes)
    for (const auto& p : played)
      if (p[0] == n.voice && p[1] == n.pitch && std::abs(p[2].get<double>() - n.onset / 8.0) < 1e-9 &&
          std::abs(p[3].get<double>() - n.end() / 8.0) < 1e-9)
        ++matched;
  CHECK(matched == c.notes.size());
}

TEST_CASE("midi: options reach the file", "[track][midi]") {
  scratch_dir dir;
  midi_options o;
  o.ppq = 96;
  o.quarter_bpm = 60.0;
  o.program = gm_program::choir_aahs;
  o.velocity = 100;
  o.beats_per_bar = 3;
  const fs::path file = dir / "options.mid";
  write_midi(file, sample(), o);
  nlohmann::json j;
  if (!read_with_mido(file, dir, j)) return;
  CHECK(j.at("ticks_per_beat") == 96);
  CHECK(j.at("tracks")[0].at("tempos") == nlohmann::json::parse("[[0, 1000000]]"));
  CHECK(j.at("tracks")[0].at("time_signatures") == nlohmann::json::parse("[[0, 3, 4]]"));
  CHECK(j.at("tracks")[3].at("programs")[0][2] == gm_program::choir_aahs);
  CHECK(j.at("tracks")[1].at("notes")[0] == nlohmann::json::parse("[0, 62, 100, 0, 96]"));
  CHECK(j.at("length_s").get<double>() == Approx(5.0));
}

TEST_CASE("midi: channels skip the percussion channel; an empty sample is a valid file", "[track][midi]") {
  CHECK(midi_channel(0) == 0);
  CHECK(midi_channel(8) == 8);
  CHECK(midi_channel(9) == 10);
  CHECK(midi_channel(14) == 15);
  scratch_dir dir;
  chorale silent{4, 8, {}};
  const fs::path file = dir / "silent.mid";
  write_midi(file, silent);
  nlohmann::json j;
  if (!read_with_mido(file, dir, j)) return;
  CHECK(j.at("tracks").size() == 5);
  CHECK(j.at("played").empty());
  CHECK(j.at("length_s").get<double>() == Approx(1.0));
}

TEST_CASE("midi: bad notes and options are refused, naming the file, and leave nothing behind", "[track][midi]") {
  scratch_dir dir;
  const fs::path file = dir / "bad.mid";
  chorale c = sample();
  c.notes.push_back({0, 18, 4, 60});  // past the last frame
  CHECK_THROWS_AS(write_midi(file, c), etude::invalid_input);
  CHECK_THROWS_WITH(write_midi(file, c), Catch::Contains(file.string()) && Catch::Contains("onset 18"));
  midi_options o;
  o.ppq = 100;  // 25 ticks a frame is fine; 100 / 3 is not
  o.frames_per_quarter = 3;
  CHECK_THROWS_AS(write_midi(file, sample(), o), etude::invalid_argument);
  chorale many{16, 4, {}};
  CHECK_THROWS_WITH(write_midi(file, many), Catch::Contains("16 voices"));
  CHECK_THROWS_AS(write_midi(dir / "missing" / "x.mid", sample()), etude::file_error);
  CHECK(fs::is_empty(dir.path()));
}
