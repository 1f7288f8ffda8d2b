// One real chorale, end to end: the first training example of the shipped corpus (data/chorales)
// read with the shard reader, checked like a generated sample (it must pass), and written as MIDI,
// WAV and a piano roll, each read back. Set ETUDE_RENDER_OUT=<dir> to keep the three files there
// (to listen and look); otherwise they go to a scratch directory.
#include <catch2/catch.hpp>

#include <png.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <etude/data/chorale_tokens.hpp>
#include <etude/data/shard_reader.hpp>
#include <etude/track/midi.hpp>
#include <etude/track/piano_roll.hpp>
#include <etude/track/synth.hpp>

#include "support.hpp"

using namespace etude::track;
namespace data = etude::data;
using etude::test::read_bytes;
using etude::test::scratch_dir;
namespace fs = std::filesystem;

namespace {
std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
std::uint32_t u32(const std::vector<unsigned char>& b, std::size_t at) {
  return b[at] | (b[at + 1] << 8) | (b[at + 2] << 16) | (static_cast<std::uint32_t>(b[at + 3]) << 24);
}
}  // namespace

TEST_CASE("render a chorale: the first training example as MIDI, WAV and piano roll", "[track][render]") {
  const data::shard_reader shard(fs::path(ETUDE_SOURCE_DIR) / "data" / "chorales" / "train-00000.etok");
  REQUIRE(shard.size() > 0);
  const auto ex = shard.example(0);
  REQUIRE(ex.codebooks() == 4);
  const etude::index_t T = ex.frames();
  std::vector<etude::token_t> tokens(static_cast<std::size_t>(4 * T));  // (K, T)
  for (int k = 0; k < 4; ++k) ex.copy(k, 0, T, tokens.data() + k * T);

  // the corpus passes the checks a generated sample gets
  const auto report = data::check_chorale(tokens, 4, T, data::chorale_corpus_ranges());
  for (const auto& f : report.findings) UNSCOPED_INFO(f.what);
  CHECK(report.ok());
  const data::chorale c = data::decode_chorale(tokens, 4, T);
  CHECK(static_cast<etude::index_t>(c.notes.size()) == report.notes);
  for (int k = 0; k < 4; ++k) {
    INFO("voice " << k);
    CHECK(std::count_if(c.notes.begin(), c.notes.end(), [&](const auto& n) { return n.voice == k; }) > 4);
  }

  scratch_dir scratch;
  const char* keep = std::getenv("ETUDE_RENDER_OUT");
  const fs::path dir = keep != nullptr && *keep != '\0' ? fs::path(keep) : scratch.path();
  fs::create_directories(dir);
  std::string stem(ex.id());
  for (char& ch : stem)
    if (ch == '/' || ch == '.') ch = '_';
  midi_options mo;
  mo.title = std::string(ex.caption().value_or(ex.id()));
  write_midi(dir / (stem + ".mid"), c, mo);
  const std::uint64_t samples = wav_renderer{}.samples_for(T);
  if (fs::exists(default_soundfont)) write_wav(dir / (stem + ".wav"), c);
  write_piano_roll(dir / (stem + ".png"), c);

  // MIDI: mido sees every note, in seconds at 8 frames a second
  const std::string python = ETUDE_PY3;
  if (!python.empty()) {
    const fs::path json = scratch / "midi.json";
    const std::string cmd = quoted(python) + " " + quoted(ETUDE_READ_MIDI_PY) + " " + quoted((dir / (stem + ".mid")).string()) +
                            " > " + quoted(json.string()) + " 2>/dev/null";
    const int status = std::system(cmd.c_str());
    REQUIRE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) {
      WARN("SKIPPED the MIDI read-back: python3 -m pip install mido");
    } else {
      REQUIRE(WEXITSTATUS(status) == 0);
      const auto b = read_bytes(json);
      const auto j = nlohmann::json::parse(std::string(b.begin(), b.end()));
      CHECK(j.at("played").size() == c.notes.size());
      CHECK(j.at("length_s").get<double>() == Approx(static_cast<double>(T) / 8.0));
    }
  }

  // WAV: the sample's length plus the tail, and sound in it
  if (fs::exists(default_soundfont)) {
    const auto b = read_bytes(dir / (stem + ".wav"));
    REQUIRE(b.size() > 44);
    CHECK(std::string(b.begin(), b.begin() + 4) == "RIFF");
    CHECK(u32(b, 40) == samples * 4);
    CHECK(b.size() == 44 + samples * 4);
    double sum = 0;
    const std::size_t n = (b.size() - 44) / 2;
    for (std::size_t i = 0; i < n; ++i) {
      const auto v = static_cast<std::int16_t>(b[44 + 2 * i] | (b[45 + 2 * i] << 8));
      sum += double(v) * v;
    }
    const double rms = std::sqrt(sum / double(n)) / 32768.0;
    INFO("RMS " << rms);
    CHECK(rms > 0.02);
  } else {
    WARN("SKIPPED the WAV: no soundfont at " << default_soundfont << "; install fluid-soundfont-gm");
  }

  // PNG: the roll's size, and the soprano's first note in its colour
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  REQUIRE(png_image_begin_read_from_file(&img, (dir / (stem + ".png")).c_str()) != 0);
  img.format = PNG_FORMAT_RGB;
  std::vector<std::uint8_t> px(PNG_IMAGE_SIZE(img));
  REQUIRE(png_image_finish_read(&img, nullptr, px.data(), 0, nullptr) != 0);
  CHECK(img.width == static_cast<png_uint_32>(T * 4));
  CHECK(img.height == 49u * 4u);
  const auto& first = c.notes.front();
  REQUIRE(first.voice == 0);
  const std::size_t at = (static_cast<std::size_t>((84 - first.pitch) * 4 + 1) * img.width +
                          static_cast<std::size_t>(first.onset * 4 + 2)) * 3;
  const rgb soprano = piano_roll_options{}.voice_colours[0];
  CHECK(rgb{px[at], px[at + 1], px[at + 2]} == soprano);
}
