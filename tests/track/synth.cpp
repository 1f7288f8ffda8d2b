// WAV files rendered with FluidSynth and the General MIDI soundfont (track/synth.hpp): the RIFF
// header read back field by field, the length (the sample's frames plus the tail), sound where
// notes are and silence where none are, the same bytes from the same notes, and the errors.
// Skips, saying why, when Debian's fluid-soundfont-gm is not installed.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <etude/data/chorale_tokens.hpp>
#include <etude/track/synth.hpp>

#include "support.hpp"

using namespace etude::track;
using etude::data::chorale;
using etude::test::read_bytes;
using etude::test::scratch_dir;
namespace fs = std::filesystem;

namespace {

std::uint32_t u32(const std::vector<unsigned char>& b, std::size_t at) {
  return b[at] | (b[at + 1] << 8) | (b[at + 2] << 16) | (static_cast<std::uint32_t>(b[at + 3]) << 24);
}
std::uint16_t u16(const std::vector<unsigned char>& b, std::size_t at) {
  return static_cast<std::uint16_t>(b[at] | (b[at + 1] << 8));
}

// A 16-bit PCM WAV file read back: its format fields and its samples (interleaved).
struct wav {
  std::uint16_t format = 0, channels = 0, bits = 0;
  std::uint32_t rate = 0;
  std::vector<std::int16_t> samples;

  std::size_t frames() const { return channels == 0 ? 0 : samples.size() / channels; }
  // RMS over sample frames [first, last), both channels, as a fraction of full scale.
  double rms(std::size_t first, std::size_t last) const {
    double sum = 0;
    for (std::size_t i = first * channels; i < last * channels; ++i) sum += double(samples[i]) * samples[i];
    return std::sqrt(sum / double((last - first) * channels)) / 32768.0;
  }
  int peak(std::size_t first, std::size_t last) const {
    int p = 0;
    for (std::size_t i = first * channels; i < last * channels; ++i) p = std::max(p, std::abs(int(samples[i])));
    return p;
  }
};

wav read_wav(const fs::path& p) {
  const auto b = read_bytes(p);
  REQUIRE(b.size() >= 44);
  REQUIRE(std::string(b.begin(), b.begin() + 4) == "RIFF");
  CHECK(u32(b, 4) == b.size() - 8);
  REQUIRE(std::string(b.begin() + 8, b.begin() + 16) == "WAVEfmt ");
  REQUIRE(u32(b, 16) == 16);
  wav w;
  w.format = u16(b, 20);
  w.channels = u16(b, 22);
  w.rate = u32(b, 24);
  CHECK(u32(b, 28) == w.rate * w.channels * 2);  // byte rate
  CHECK(u16(b, 32) == w.channels * 2);           // block align
  w.bits = u16(b, 34);
  REQUIRE(std::string(b.begin() + 36, b.begin() + 40) == "data");
  const std::uint32_t data = u32(b, 40);
  REQUIRE(data == b.size() - 44);
  w.samples.resize(data / 2);
  for (std::size_t i = 0; i < w.samples.size(); ++i) w.samples[i] = static_cast<std::int16_t>(u16(b, 44 + 2 * i));
  return w;
}

bool have_soundfont() {
  if (fs::exists(default_soundfont)) return true;
  WARN("SKIPPED: no soundfont at " << default_soundfont << "; install Debian's fluid-soundfont-gm");
  return false;
}

// One renderer for the whole program.
wav_renderer& renderer() {
  static wav_renderer r;
  return r;
}

}  // namespace

TEST_CASE("synth: a chorale renders to a 16-bit stereo WAV of the right length, sounding where the notes are",
          "[track][synth]") {
  if (!have_soundfont()) return;
  scratch_dir dir;
  // 24 frames (3 s): all four voices sound a C major chord from frame 8 to frame 16, nothing before
  // or after; then the 1.5 s tail
  chorale c{4, 24, {{0, 8, 8, 72}, {1, 8, 8, 67}, {2, 8, 8, 64}, {3, 8, 8, 48}}};
  const fs::path file = dir / "chord.wav";
  renderer().render(file, c);
  const wav w = read_wav(file);
  CHECK(w.format == 1);
  CHECK(w.channels == 2);
  CHECK(w.bits == 16);
  CHECK(w.rate == 44100);
  CHECK(w.frames() == 3 * 44100 + 44100 * 3 / 2);
  CHECK(renderer().samples_for(24) == w.frames());
  // silence until the onset at 1 s (FluidSynth starts a note within its 64-sample block)
  CHECK(w.peak(0, 44100) == 0);
  // sound while the chord is held: 1.1 .. 1.9 s
  const double held = w.rms(48510, 83790);
  INFO("RMS while held: " << held);
  CHECK(held > 0.02);
  CHECK(w.peak(48510, 83790) < 32767);  // no clipping
  // after the release and the reverb, quiet again: the last 0.25 s of the tail
  const double end = w.rms(w.frames() - 11025, w.frames());
  INFO("RMS at the end: " << end);
  CHECK(end < held / 100);
}

TEST_CASE("synth: an all-rest sample is silence of its length; the same notes give the same bytes", "[track][synth]") {
  if (!have_soundfont()) return;
  scratch_dir dir;
  chorale rests{4, 16, {}};
  renderer().render(dir / "rests.wav", rests);
  const wav w = read_wav(dir / "rests.wav");
  CHECK(w.frames() == renderer().samples_for(16));
  CHECK(w.frames() == 2 * 44100 + 66150);
  CHECK(w.peak(0, w.frames()) == 0);

  // repeated notes are struck again (a note-off and a note-on at one sample)
  chorale c{1, 8, {{0, 0, 2, 60}, {0, 2, 2, 60}, {0, 4, 4, 62}}};
  renderer().render(dir / "a.wav", c);
  renderer().render(dir / "rests2.wav", rests);  // in between, so state would show
  renderer().render(dir / "b.wav", c);
  CHECK(read_bytes(dir / "a.wav") == read_bytes(dir / "b.wav"));
  CHECK(read_bytes(dir / "rests.wav") == read_bytes(dir / "rests2.wav"));
  CHECK(read_wav(dir / "a.wav").rms(0, 44100) > 0.01);
}

TEST_CASE("synth: options (32 kHz, no tail) reach the file", "[track][synth]") {
  if (!have_soundfont()) return;
  scratch_dir dir;
  synth_options o;
  o.sample_rate = 32000;
  o.tail_seconds = 0;
  o.program = gm_program::choir_aahs;
  write_wav(dir / "x.wav", chorale{2, 12, {{0, 0, 12, 69}, {1, 4, 8, 57}}}, o);
  const wav w = read_wav(dir / "x.wav");
  CHECK(w.rate == 32000);
  CHECK(w.frames() == 48000);  // 12 frames at 8 per second
  CHECK(w.rms(8000, 48000) > 0.005);
}

TEST_CASE("synth: a missing soundfont and bad notes are errors that say what to do", "[track][synth]") {
  scratch_dir dir;
  synth_options o;
  o.soundfont = dir / "none.sf2";
  CHECK_THROWS_AS(wav_renderer(o), etude::file_error);
  CHECK_THROWS_WITH(wav_renderer(o), Catch::Contains((dir / "none.sf2").string()) &&
                                         Catch::Contains("install fluid-soundfont-gm") && Catch::Contains("--soundfont"));
  etude::test::write_bytes(dir / "junk.sf2", {'n', 'o', 't', ' ', 's', 'f', '2'});
  o.soundfont = dir / "junk.sf2";
  CHECK_THROWS_WITH(wav_renderer(o), Catch::Contains("cannot load this soundfont"));
  o = {};
  o.sample_rate = 1000;
  CHECK_THROWS_AS(wav_renderer(o), etude::invalid_argument);

  if (!have_soundfont()) return;
  const fs::path file = dir / "bad.wav";
  CHECK_THROWS_WITH(renderer().render(file, chorale{1, 4, {{0, 2, 4, 60}}}), Catch::Contains(file.string()));
  CHECK_THROWS_AS(renderer().render(dir / "missing" / "x.wav", chorale{1, 4, {}}), etude::file_error);
  CHECK_FALSE(fs::exists(file));
}
