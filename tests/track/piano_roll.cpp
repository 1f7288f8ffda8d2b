// Piano-roll PNGs (track/piano_roll.hpp) decoded back with libpng's reader: the size follows the
// frames and the pitch range, and the pixels of known notes, onsets, bar lines, octave lines and
// background have their colours, at positions this test computes itself.
#include <catch2/catch.hpp>

#include <png.h>

#include <cstring>
#include <string>
#include <vector>

#include <etude/data/chorale_tokens.hpp>
#include <etude/track/piano_roll.hpp>

#include "support.hpp"

using namespace etude::track;
using etude::data::chorale;
using etude::test::scratch_dir;
namespace fs = std::filesystem;

namespace {

struct decoded {
  int width = 0, height = 0;
  std::vector<std::uint8_t> rgb_pixels;
  rgb at(int x, int y) const {
    const std::size_t i = (static_cast<std::size_t>(y) * static_cast<std::size_t>(width) + static_cast<std::size_t>(x)) * 3;
    return {rgb_pixels[i], rgb_pixels[i + 1], rgb_pixels[i + 2]};
  }
};

decoded read_png(const fs::path& p) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  INFO(p.string());
  REQUIRE(png_image_begin_read_from_file(&img, p.c_str()) != 0);
  CHECK(img.format == PNG_FORMAT_RGB);  // written as 8-bit RGB, no alpha
  img.format = PNG_FORMAT_RGB;
  decoded d;
  d.width = static_cast<int>(img.width);
  d.height = static_cast<int>(img.height);
  d.rgb_pixels.resize(PNG_IMAGE_SIZE(img));
  REQUIRE(png_image_finish_read(&img, nullptr, d.rgb_pixels.data(), 0, nullptr) != 0);
  return d;
}

// Pixel column of a frame and row of a pitch with the default 4 x 4 pixels and pitches 36..84.
int x_of(int frame) { return frame * 4; }
int y_of(int pitch) { return (84 - pitch) * 4; }

}  // namespace

TEST_CASE("piano roll: size, voice colours, onsets, unisons, bar and octave lines", "[track][piano_roll]") {
  scratch_dir dir;
  const chorale c{4, 20,
                  {{0, 0, 4, 74}, {0, 4, 4, 74},            // soprano: D5 struck twice
                   {1, 2, 8, 65},                           // alto: F4, frames 2..9
                   {2, 8, 4, 65},                           // tenor: F4 in unison with the alto at frames 8, 9
                   {3, 0, 18, 48},                          // bass: C3, on an octave line
                   {3, 18, 2, 30}}};                        // below the roll's range: left out
  const fs::path file = dir / "roll.png";
  write_piano_roll(file, c);
  const decoded d = read_png(file);
  const piano_roll_options o;
  REQUIRE(d.width == 20 * 4);
  REQUIRE(d.height == 49 * 4);
  const rgb S = o.voice_colours[0], A = o.voice_colours[1], T = o.voice_colours[2], B = o.voice_colours[3];

  // the soprano's notes: bright first column, body after, and the repeated onset bright again
  CHECK(d.at(x_of(0), y_of(74)) == onset_colour(S));
  CHECK(d.at(x_of(0) + 1, y_of(74) + 2) == S);
  CHECK(d.at(x_of(3) + 3, y_of(74) + 3) == S);
  CHECK(d.at(x_of(4), y_of(74)) == onset_colour(S));
  CHECK(d.at(x_of(7) + 3, y_of(74)) == S);
  CHECK(d.at(x_of(8), y_of(74)) == o.background);  // released at frame 8
  CHECK(d.at(x_of(3), y_of(75) + 3) == o.background);  // the semitone above stays dark
  // alto, and where the tenor sounds the same pitch the upper voice is seen
  CHECK(d.at(x_of(2), y_of(65)) == onset_colour(A));
  CHECK(d.at(x_of(5) + 2, y_of(65) + 1) == A);
  CHECK(d.at(x_of(8), y_of(65)) == A);
  CHECK(d.at(x_of(9) + 3, y_of(65)) == A);
  CHECK(d.at(x_of(10) + 1, y_of(65)) == T);  // the tenor goes on alone
  CHECK(d.at(x_of(11) + 3, y_of(65) + 3) == T);
  // the bass over the C octave line and the bar line at frame 16
  CHECK(d.at(x_of(0), y_of(48) + 3) == onset_colour(B));
  CHECK(d.at(x_of(10), y_of(48) + 3) == B);
  CHECK(d.at(x_of(16), y_of(48)) == B);
  CHECK(d.at(x_of(17) + 3, y_of(48)) == B);
  // grid where nothing sounds: the bottom row of every C, the first column of every bar
  CHECK(d.at(x_of(12), y_of(60) + 3) == o.octave_line);
  CHECK(d.at(x_of(12), y_of(72) + 3) == o.octave_line);
  CHECK(d.at(x_of(12), y_of(72) + 2) == o.background);
  CHECK(d.at(x_of(16), y_of(80)) == o.bar_line);
  CHECK(d.at(x_of(16) + 1, y_of(80)) == o.background);
  CHECK(d.at(x_of(0), y_of(80)) == o.background);  // no line at frame 0
  // the note below the range is nowhere: its frames hold only grid and background
  for (int x = x_of(18); x < d.width; ++x)
    for (int y = 0; y < d.height; ++y) {
      const rgb p = d.at(x, y);
      REQUIRE((p == o.background || p == o.octave_line || p == o.bar_line));
    }
  // the same as drawn in memory
  const auto img = draw_piano_roll(c);
  CHECK(img.pixels == d.rgb_pixels);
}

TEST_CASE("piano roll: options and an empty sample", "[track][piano_roll]") {
  scratch_dir dir;
  piano_roll_options o;
  o.px_per_frame = 2;
  o.px_per_pitch = 3;
  o.low_pitch = 60;
  o.high_pitch = 71;
  o.frames_per_bar = 0;
  write_piano_roll(dir / "small.png", chorale{1, 10, {{0, 5, 5, 71}}}, o);
  const decoded d = read_png(dir / "small.png");
  CHECK(d.width == 20);
  CHECK(d.height == 36);
  CHECK(d.at(10, 0) == onset_colour(o.voice_colours[0]));
  CHECK(d.at(19, 2) == o.voice_colours[0]);
  CHECK(d.at(9, 0) == o.background);
  CHECK(d.at(0, 35) == o.octave_line);  // C4 is the bottom row

  write_piano_roll(dir / "empty.png", chorale{4, 0, {}});  // one frame wide, all grid
  const decoded e = read_png(dir / "empty.png");
  CHECK(e.width == 4);
  CHECK(e.height == 196);
}

TEST_CASE("piano roll: bad options are refused and a failed write names the file", "[track][piano_roll]") {
  scratch_dir dir;
  piano_roll_options o;
  o.px_per_frame = 0;
  CHECK_THROWS_AS(draw_piano_roll(chorale{1, 4, {}}, o), etude::invalid_argument);
  o = {};
  o.low_pitch = 90;
  o.high_pitch = 80;
  CHECK_THROWS_WITH(draw_piano_roll(chorale{1, 4, {}}, o), Catch::Contains("90..80"));
  o = {};
  o.voice_colours.clear();
  CHECK_THROWS_AS(draw_piano_roll(chorale{1, 4, {}}, o), etude::invalid_argument);
  const fs::path missing = dir / "missing" / "roll.png";
  CHECK_THROWS_AS(write_piano_roll(missing, chorale{1, 4, {}}), etude::file_error);
  CHECK_THROWS_WITH(write_piano_roll(missing, chorale{1, 4, {}}), Catch::Contains(missing.string()));
}
